//! Per-method authorization as machined enforces it (talos-facts §10.6): the caller's roles
//! come from the client certificate's Organization (maintenance mode: every caller is
//! `os:reader`), and each full gRPC method path allows a set of roles; a path not in the table
//! allows `os:admin` only. A refusal is `PermissionDenied "not authorized"`. Applied to every
//! call a node serves locally, before any handler, as machined's interceptor does; handlers
//! only add the "reader may, in maintenance only" checks.

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use tonic::Status;

/// A Talos API role (the names in `pkg/machinery/role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Role {
    Admin,
    Operator,
    Reader,
    EtcdBackup,
    ImageVerifier,
    MetaWriter,
}

impl Role {
    /// The role as a certificate's Organization names it; unknown names are ignored.
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "os:admin" => Self::Admin,
            "os:operator" => Self::Operator,
            "os:reader" => Self::Reader,
            "os:etcd:backup" => Self::EtcdBackup,
            "os:image:verifier" => Self::ImageVerifier,
            "os:meta:writer" => Self::MetaWriter,
            _ => return None,
        })
    }

    /// Who may call a method that needs this role, in the table's terms: a reader-level
    /// method allows admin, operator and reader; an operator-level one admin and operator;
    /// the snapshot admin, operator and etcd backup; everything else admin.
    fn holders(self) -> &'static [Self] {
        match self {
            Self::Reader => READ,
            Self::Operator => OPERATE,
            Self::EtcdBackup => &[Self::Admin, Self::Operator, Self::EtcdBackup],
            _ => ADMIN,
        }
    }
}

use Role::{Admin, EtcdBackup, ImageVerifier, MetaWriter, Operator, Reader};

const ADMIN: &[Role] = &[Admin];
const OPERATE: &[Role] = &[Admin, Operator];
const READ: &[Role] = &[Admin, Operator, Reader];
const READ_OR_BACKUP: &[Role] = &[Admin, Operator, Reader, EtcdBackup];
/// Admin, and reader too: the handler then refuses a reader outside maintenance.
const ADMIN_OR_MAINTENANCE_READER: &[Role] = &[Admin, Reader];

/// machined's rules table (siderolabs/talos v1.14.1,
/// internal/app/machined/pkg/system/services/machined.go), in full.
pub(crate) const RULES: &[(&str, &[Role])] = &[
    ("/cluster.ClusterService/HealthCheck", READ),
    (
        "/inspect.InspectService/ControllerRuntimeDependencies",
        READ,
    ),
    ("/machine.ImageService/Import", ADMIN),
    ("/machine.ImageService/List", READ),
    ("/machine.ImageService/Pull", OPERATE),
    ("/machine.ImageService/Remove", ADMIN),
    (
        "/machine.ImageService/Verify",
        &[Admin, Operator, Reader, ImageVerifier],
    ),
    ("/machine.DebugService/ContainerRun", ADMIN),
    ("/machine.LifecycleService/Install", ADMIN),
    ("/machine.LifecycleService/Upgrade", ADMIN),
    (
        "/machine.MachineService/ApplyConfiguration",
        ADMIN_OR_MAINTENANCE_READER,
    ),
    ("/machine.MachineService/Bootstrap", ADMIN),
    ("/machine.MachineService/CPUInfo", READ),
    ("/machine.MachineService/CPUFreqStats", READ),
    ("/machine.MachineService/Containers", READ),
    ("/machine.MachineService/Copy", ADMIN),
    ("/machine.MachineService/DiskStats", READ),
    ("/machine.MachineService/DiskUsage", READ),
    ("/machine.MachineService/Dmesg", READ),
    ("/machine.MachineService/EtcdAlarmList", READ_OR_BACKUP),
    ("/machine.MachineService/EtcdAlarmDisarm", OPERATE),
    ("/machine.MachineService/EtcdDefragment", OPERATE),
    ("/machine.MachineService/EtcdForfeitLeadership", ADMIN),
    ("/machine.MachineService/EtcdLeaveCluster", ADMIN),
    ("/machine.MachineService/EtcdMemberList", READ_OR_BACKUP),
    ("/machine.MachineService/EtcdRecover", ADMIN),
    ("/machine.MachineService/EtcdRemoveMemberByID", ADMIN),
    (
        "/machine.MachineService/EtcdSnapshot",
        &[Admin, Operator, EtcdBackup],
    ),
    ("/machine.MachineService/EtcdStatus", READ_OR_BACKUP),
    ("/machine.MachineService/EtcdDowngradeCancel", ADMIN),
    ("/machine.MachineService/EtcdDowngradeEnable", ADMIN),
    ("/machine.MachineService/EtcdDowngradeValidate", ADMIN),
    ("/machine.MachineService/Events", READ),
    ("/machine.MachineService/GenerateClientConfiguration", ADMIN),
    ("/machine.MachineService/Hostname", READ),
    ("/machine.MachineService/ImageList", READ),
    ("/machine.MachineService/ImagePull", OPERATE),
    ("/machine.MachineService/Kubeconfig", ADMIN),
    ("/machine.MachineService/List", READ),
    ("/machine.MachineService/LoadAvg", READ),
    ("/machine.MachineService/Logs", READ),
    ("/machine.MachineService/LogsContainers", READ),
    ("/machine.MachineService/Memory", READ),
    ("/machine.MachineService/MetaWrite", &[Admin, MetaWriter]),
    ("/machine.MachineService/MetaDelete", &[Admin, MetaWriter]),
    ("/machine.MachineService/Mounts", READ),
    ("/machine.MachineService/NetworkDeviceStats", READ),
    ("/machine.MachineService/Netstat", READ),
    ("/machine.MachineService/PacketCapture", OPERATE),
    ("/machine.MachineService/Processes", READ),
    ("/machine.MachineService/Read", ADMIN),
    ("/machine.MachineService/Reboot", OPERATE),
    ("/machine.MachineService/Reset", ADMIN),
    ("/machine.MachineService/Restart", OPERATE),
    ("/machine.MachineService/Rollback", ADMIN),
    ("/machine.MachineService/ServiceList", READ),
    ("/machine.MachineService/ServiceRestart", OPERATE),
    ("/machine.MachineService/ServiceStart", OPERATE),
    ("/machine.MachineService/ServiceStop", OPERATE),
    ("/machine.MachineService/Shutdown", OPERATE),
    ("/machine.MachineService/Stats", READ),
    ("/machine.MachineService/SystemStat", READ),
    ("/machine.MachineService/Upgrade", ADMIN),
    ("/machine.MachineService/Version", READ),
    ("/cosi.resource.State/Create", ADMIN),
    ("/cosi.resource.State/Destroy", ADMIN),
    ("/cosi.resource.State/Teardown", ADMIN),
    ("/cosi.resource.State/TeardownAndDestroy", ADMIN),
    ("/cosi.resource.State/Get", READ),
    ("/cosi.resource.State/List", READ),
    ("/cosi.resource.State/Update", ADMIN),
    ("/cosi.resource.State/Watch", READ),
    ("/storage.StorageService/Disks", READ),
    (
        "/storage.StorageService/BlockDeviceWipe",
        ADMIN_OR_MAINTENANCE_READER,
    ),
    (
        "/machine.LVMService/LogicalVolumeRemove",
        ADMIN_OR_MAINTENANCE_READER,
    ),
    (
        "/machine.LVMService/VolumeGroupRemove",
        ADMIN_OR_MAINTENANCE_READER,
    ),
    (
        "/machine.LVMService/PhysicalVolumeRemove",
        ADMIN_OR_MAINTENANCE_READER,
    ),
    ("/machine.MDService/Destroy", ADMIN_OR_MAINTENANCE_READER),
    ("/time.TimeService/Time", READ),
    ("/time.TimeService/TimeCheck", READ),
];

/// The roles allowed to call `path`: its rule, or admin only.
pub(crate) fn allowed(path: &str) -> &'static [Role] {
    RULES
        .iter()
        .find(|(p, _)| *p == path)
        .map_or(ADMIN, |(_, roles)| roles)
}

/// machined's refusal.
pub(crate) fn not_authorized() -> Status {
    Status::permission_denied("not authorized")
}

/// Refuses `path` unless one of `roles` is allowed to call it.
pub(crate) fn check(path: &str, roles: &[Role]) -> Result<(), Status> {
    let allowed = allowed(path);
    if roles.iter().any(|r| allowed.contains(r)) {
        Ok(())
    } else {
        Err(not_authorized())
    }
}

/// The known roles in a client certificate chain's leaf; none without one.
pub(crate) fn roles_of(certs: Option<&Arc<Vec<CertificateDer<'static>>>>) -> Vec<Role> {
    let Some(leaf) = certs.and_then(|c| c.first()) else {
        return Vec::new();
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf.as_ref()) else {
        return Vec::new();
    };
    cert.subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .filter_map(Role::parse)
        .collect()
}

/// The caller's roles on a node: `os:reader` for everyone in maintenance mode (talos-facts
/// §2), the certificate's roles once configured.
pub(crate) fn caller_roles(
    maintenance: bool,
    certs: Option<&Arc<Vec<CertificateDer<'static>>>>,
) -> Vec<Role> {
    if maintenance {
        vec![Reader]
    } else {
        roles_of(certs)
    }
}

/// A handler's own check: the caller (mutual TLS) holds a role allowed at `needed`'s level
/// (for the methods whose rule lets a reader through only in maintenance mode, `Admin`).
pub(crate) fn authorize<T>(request: &tonic::Request<T>, needed: Role) -> Result<(), Status> {
    let roles = roles_of(request.peer_certs().as_ref());
    if roles.iter().any(|r| needed.holders().contains(r)) {
        Ok(())
    } else {
        Err(not_authorized())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use prost::Message as _;

    /// Every method the simulator serves, and who may call it on a configured node — written
    /// out from Talos's table, one column per role: admin, operator, reader, etcd backup.
    const EXPECTED: &[(&str, [bool; 4])] = &[
        (
            "/machine.MachineService/ApplyConfiguration",
            [true, false, true, false],
        ),
        (
            "/machine.MachineService/Bootstrap",
            [true, false, false, false],
        ),
        (
            "/machine.MachineService/EtcdMemberList",
            [true, true, true, true],
        ),
        (
            "/machine.MachineService/EtcdRemoveMemberByID",
            [true, false, false, false],
        ),
        (
            "/machine.MachineService/EtcdLeaveCluster",
            [true, false, false, false],
        ),
        (
            "/machine.MachineService/EtcdForfeitLeadership",
            [true, false, false, false],
        ),
        (
            "/machine.MachineService/EtcdStatus",
            [true, true, true, true],
        ),
        (
            "/machine.MachineService/EtcdSnapshot",
            [true, true, false, true],
        ),
        (
            "/machine.MachineService/EtcdRecover",
            [true, false, false, false],
        ),
        (
            "/machine.MachineService/EtcdDefragment",
            [true, true, false, false],
        ),
        ("/machine.MachineService/Reset", [true, false, false, false]),
        ("/machine.MachineService/Reboot", [true, true, false, false]),
        (
            "/machine.MachineService/Shutdown",
            [true, true, false, false],
        ),
        (
            "/machine.MachineService/Upgrade",
            [true, false, false, false],
        ),
        ("/machine.MachineService/Version", [true, true, true, false]),
        (
            "/machine.MachineService/Hostname",
            [true, true, true, false],
        ),
        (
            "/machine.MachineService/ServiceList",
            [true, true, true, false],
        ),
        ("/machine.MachineService/Events", [true, true, true, false]),
        ("/machine.MachineService/Read", [true, false, false, false]),
        (
            "/machine.LifecycleService/Install",
            [true, false, false, false],
        ),
        (
            "/machine.LifecycleService/Upgrade",
            [true, false, false, false],
        ),
        ("/machine.ImageService/Pull", [true, true, false, false]),
        ("/storage.StorageService/Disks", [true, true, true, false]),
        (
            "/storage.StorageService/BlockDeviceWipe",
            [true, false, true, false],
        ),
        ("/cosi.resource.State/Get", [true, true, true, false]),
        ("/cosi.resource.State/List", [true, true, true, false]),
        ("/cosi.resource.State/Watch", [true, true, true, false]),
        ("/cosi.resource.State/Create", [true, false, false, false]),
        ("/cosi.resource.State/Update", [true, false, false, false]),
        ("/cosi.resource.State/Destroy", [true, false, false, false]),
        // Not in the table: admin only.
        (
            "/machine.MachineService/NoSuchMethod",
            [true, false, false, false],
        ),
        (
            "/cluster.ClusterService/HealthCheck",
            [true, true, true, false],
        ),
        (
            "/machine.MachineService/Kubeconfig",
            [true, false, false, false],
        ),
        ("/machine.MachineService/Dmesg", [true, true, true, false]),
    ];

    #[test]
    fn each_role_may_call_what_talos_allows_it() {
        for (path, expected) in EXPECTED {
            for (role, may) in [Admin, Operator, Reader, EtcdBackup]
                .into_iter()
                .zip(expected)
            {
                assert_eq!(
                    check(path, &[role]).is_ok(),
                    *may,
                    "{role:?} calling {path}"
                );
            }
            assert!(check(path, &[]).is_err(), "no role may call {path}");
        }
    }

    #[test]
    fn every_served_method_has_an_expectation() {
        let fds = prost_types::FileDescriptorSet::decode(ichor_talos::FILE_DESCRIPTOR_SET)
            .expect("descriptor set");
        let served: BTreeSet<String> = fds
            .file
            .iter()
            .flat_map(|f| {
                f.service.iter().flat_map(move |s| {
                    s.method
                        .iter()
                        .map(move |m| format!("/{}.{}/{}", f.package(), s.name(), m.name()))
                })
            })
            .collect();
        let expected: BTreeSet<String> = EXPECTED.iter().map(|(p, _)| (*p).to_owned()).collect();
        let missing: Vec<_> = served.difference(&expected).collect();
        assert!(missing.is_empty(), "no expectation for {missing:?}");
    }

    #[test]
    fn maintenance_makes_everyone_a_reader() {
        assert_eq!(caller_roles(true, None), vec![Reader]);
        assert!(caller_roles(false, None).is_empty());
        assert!(check("/machine.MachineService/Reboot", &caller_roles(true, None)).is_err());
        assert!(check("/machine.MachineService/Events", &caller_roles(true, None)).is_ok());
    }
}
