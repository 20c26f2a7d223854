//! What the machine's firmware keeps for its BMC: the boot override and the virtual CD, and
//! which device a boot through the firmware starts from. Shared by the BMC (which sets them)
//! and the node (whose power-ons and reboots read them, `Node::boot`).

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::factory::FactoryIso;

/// `Boot.BootSourceOverrideEnabled` (Redfish `ComputerSystem.BootSourceOverrideEnabled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Enabled {
    /// No override: the firmware's boot order.
    #[default]
    Disabled,
    /// The next boot only; the firmware sets it back to `Disabled` as that boot starts.
    Once,
    /// Every boot until changed.
    Continuous,
}

/// `Boot.BootSourceOverrideTarget`, the values this BMC offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Target {
    /// The firmware's boot order.
    #[default]
    None,
    /// The virtual CD.
    Cd,
    /// The system disk.
    Hdd,
}

/// The names of a setting's values, as Redfish writes them.
pub(crate) trait Named: Sized + Copy + PartialEq + 'static {
    /// Every value with its name, in the order `@Redfish.AllowableValues` lists them.
    const ALL: &'static [(Self, &'static str)];

    /// The value's name.
    fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(v, _)| *v == self)
            .map_or("", |(_, n)| n)
    }

    /// The value named `name`.
    fn named(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(v, _)| *v)
    }

    /// Every name.
    fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|(_, n)| *n).collect()
    }
}

impl Named for Enabled {
    const ALL: &'static [(Self, &'static str)] = &[
        (Self::Disabled, "Disabled"),
        (Self::Once, "Once"),
        (Self::Continuous, "Continuous"),
    ];
}

impl Named for Target {
    const ALL: &'static [(Self, &'static str)] =
        &[(Self::None, "None"), (Self::Cd, "Cd"), (Self::Hdd, "Hdd")];
}

/// The image in the virtual CD drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Media {
    /// The URL given with `InsertMedia`.
    pub(crate) url: String,
    /// The ISO it names.
    pub(crate) iso: FactoryIso,
    /// Whether the image is inserted (`InsertMedia`'s `Inserted`): only then can it boot.
    pub(crate) inserted: bool,
    /// `WriteProtected`.
    pub(crate) write_protected: bool,
}

/// The firmware's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) enabled: Enabled,
    pub(crate) target: Target,
    pub(crate) media: Option<Media>,
}

/// The firmware of a machine with a BMC.
#[derive(Debug, Default)]
pub(crate) struct Firmware {
    settings: Mutex<Settings>,
}

impl Firmware {
    /// The settings, to read or change.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Settings> {
        self.settings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The ISO a boot through the firmware starts from, or `None` for the system disk (or, on
    /// a disk with nothing to boot, whatever the machine booted before: the simulator's
    /// machines carry their own boot ISO). A `Once` override is consumed here, as the boot
    /// starts. An override to `Cd` boots the virtual CD when an image is inserted; without
    /// one the firmware goes on down its boot order. With no override, a disk that can boot
    /// (`disk_boots`) comes first, then an inserted CD.
    pub(crate) fn boot_device(&self, disk_boots: bool) -> Option<FactoryIso> {
        let mut settings = self.lock();
        let target = match settings.enabled {
            Enabled::Disabled => Target::None,
            Enabled::Once => {
                settings.enabled = Enabled::Disabled;
                settings.target
            }
            Enabled::Continuous => settings.target,
        };
        let cd = settings
            .media
            .as_ref()
            .filter(|m| m.inserted)
            .map(|m| m.iso.clone());
        match target {
            Target::Cd => cd,
            Target::Hdd => None,
            Target::None => cd.filter(|_| !disk_boots),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iso() -> FactoryIso {
        FactoryIso {
            schematic: "s".into(),
            version: "v1.14.1".into(),
            file: "metal-amd64.iso".into(),
        }
    }

    fn with(enabled: Enabled, target: Target, inserted: bool) -> Firmware {
        let firmware = Firmware::default();
        *firmware.lock() = Settings {
            enabled,
            target,
            media: Some(Media {
                url: "u".into(),
                iso: iso(),
                inserted,
                write_protected: true,
            }),
        };
        firmware
    }

    #[test]
    fn a_one_time_cd_override_boots_the_cd_once() {
        let firmware = with(Enabled::Once, Target::Cd, true);
        assert_eq!(firmware.boot_device(true), Some(iso()));
        assert_eq!(firmware.lock().enabled, Enabled::Disabled);
        assert_eq!(firmware.boot_device(true), None, "the disk boots next");
    }

    #[test]
    fn a_continuous_override_stays() {
        let firmware = with(Enabled::Continuous, Target::Cd, true);
        assert_eq!(firmware.boot_device(true), Some(iso()));
        assert_eq!(firmware.boot_device(true), Some(iso()));
    }

    #[test]
    fn without_an_override_a_disk_that_boots_comes_first() {
        assert_eq!(
            with(Enabled::Disabled, Target::Cd, true).boot_device(true),
            None
        );
        assert_eq!(
            with(Enabled::Disabled, Target::None, true).boot_device(false),
            Some(iso())
        );
    }

    #[test]
    fn media_not_inserted_does_not_boot() {
        let firmware = with(Enabled::Once, Target::Cd, false);
        assert_eq!(firmware.boot_device(false), None);
        assert_eq!(
            firmware.lock().enabled,
            Enabled::Disabled,
            "consumed all the same"
        );
    }

    #[test]
    fn names_read_back() {
        assert_eq!(Target::named("Cd"), Some(Target::Cd));
        assert_eq!(Enabled::Once.name(), "Once");
        assert_eq!(Target::names(), ["None", "Cd", "Hdd"]);
    }
}
