//! Matching a Redfish system to the machine Talos reports, by UUID.
//!
//! Talos reports the SMBIOS System UUID (`SystemInformations.hardware.talos.dev`, field `uuid`),
//! read from the firmware's SMBIOS Type 1 structure by `siderolabs/go-smbios`, lowercase
//! (talos-facts §8.6). Since SMBIOS 2.6 the specification (DSP0134 §7.2.1) stores the first
//! three fields of the UUID (`time_low`, `time_mid`, `time_hi_and_version`) little-endian, and
//! go-smbios swaps them back into the RFC 4122 order for such tables. Firmware that wrote the
//! UUID in network order anyway, or a BMC that reads those bytes in the other order, reports the
//! same 16 bytes with those three fields byte-swapped. Both orders are therefore taken as one
//! machine; the last two fields are never swapped by anyone, so they must match as they are.

/// Whether `redfish` (a Redfish `ComputerSystem.UUID`) and `smbios` (the SMBIOS UUID Talos
/// reports) name the same machine: equal ignoring case, or equal once the first three fields of
/// one are byte-swapped. A UUID that does not parse (8-4-4-4-12 hexadecimal digits, optionally
/// in braces), and the all-zero and all-`FF` UUIDs (SMBIOS: "not present" and "not set"), match
/// nothing.
#[must_use]
pub fn smbios_uuid_matches(redfish: &str, smbios: &str) -> bool {
    let (Some(redfish), Some(smbios)) = (parse(redfish), parse(smbios)) else {
        return false;
    };
    identifies(&redfish) && (redfish == smbios || redfish == swap_leading_fields(smbios))
}

/// The 16 bytes of a UUID written as 8-4-4-4-12 hexadecimal digits (either case), optionally in
/// braces.
fn parse(text: &str) -> Option<[u8; 16]> {
    let text = text.trim();
    let text = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or(text);
    let groups: Vec<&str> = text.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if lengths != [8, 4, 4, 4, 12] {
        return None;
    }
    let digits: Vec<u8> = groups
        .concat()
        .chars()
        .map(|c| c.to_digit(16).and_then(|d| u8::try_from(d).ok()))
        .collect::<Option<_>>()?;
    let mut bytes = [0u8; 16];
    for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
        if let [high, low] = pair {
            *byte = (high << 4) | low;
        }
    }
    Some(bytes)
}

/// The UUID with `time_low` (4 bytes), `time_mid` (2) and `time_hi_and_version` (2) each
/// byte-reversed: the other of the two orders firmware and BMCs use.
fn swap_leading_fields(mut bytes: [u8; 16]) -> [u8; 16] {
    bytes[0..4].reverse();
    bytes[4..6].reverse();
    bytes[6..8].reverse();
    bytes
}

/// Whether a UUID identifies anything: SMBIOS uses all `00` for "not present" and all `FF` for
/// "not set", values many machines share.
fn identifies(bytes: &[u8; 16]) -> bool {
    !bytes.iter().all(|b| *b == 0) && !bytes.iter().all(|b| *b == 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DSP0134 §7.2.1's own example: {00112233-4455-6677-8899-AABBCCDDEEFF} is stored as
    /// `33 22 11 00 55 44 77 66 88 99 AA BB CC DD EE FF`; read in the other order it prints as
    /// 33221100-5544-7766-8899-aabbccddeeff.
    #[test]
    fn matches_the_specifications_example_in_both_orders() {
        let spec = "00112233-4455-6677-8899-AABBCCDDEEFF";
        assert!(smbios_uuid_matches(
            spec,
            "00112233-4455-6677-8899-aabbccddeeff"
        ));
        assert!(smbios_uuid_matches(
            spec,
            "33221100-5544-7766-8899-aabbccddeeff"
        ));
        assert!(smbios_uuid_matches(
            "33221100-5544-7766-8899-AABBCCDDEEFF",
            spec
        ));
    }

    #[test]
    fn ignores_case_and_braces() {
        assert!(smbios_uuid_matches(
            "{4C4C4544-0042-3510-8052-B4C04F4B4E32}",
            "4c4c4544-0042-3510-8052-b4c04f4b4e32"
        ));
    }

    #[test]
    fn the_last_two_fields_are_never_swapped() {
        // clock_seq and node reversed: another machine.
        assert!(!smbios_uuid_matches(
            "00112233-4455-6677-8899-aabbccddeeff",
            "33221100-5544-7766-9988-ffeeddccbbaa"
        ));
        // Only time_low swapped: neither order.
        assert!(!smbios_uuid_matches(
            "00112233-4455-6677-8899-aabbccddeeff",
            "33221100-4455-6677-8899-aabbccddeeff"
        ));
    }

    #[test]
    fn a_different_machine_does_not_match() {
        assert!(!smbios_uuid_matches(
            "27946b59-9e44-4fa7-8e91-f3527a1ef094",
            "27946b59-9e44-4fa7-8e91-f3527a1ef095"
        ));
    }

    #[test]
    fn placeholders_and_garbage_match_nothing() {
        let zero = "00000000-0000-0000-0000-000000000000";
        let unset = "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF";
        assert!(!smbios_uuid_matches(zero, zero));
        assert!(!smbios_uuid_matches(unset, unset));
        for bad in [
            "",
            "not-a-uuid",
            "001122334455667788990aabbccddeeff",
            "00112233-4455-6677-8899-aabbccddeef",
            "00112233-4455-6677-8899-aabbccddeefg",
            "0011223-34455-6677-8899-aabbccddeeff",
            "00112233-4455-6677-8899-aabbccddeeff-",
            "ü0112233-4455-6677-8899-aabbccddeef",
            "+0112233-4455-6677-8899-aabbccddeeff",
        ] {
            assert!(
                !smbios_uuid_matches(bad, bad),
                "{bad:?} should match nothing"
            );
        }
    }
}
