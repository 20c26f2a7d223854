//! Builders for CEL rule text used in more than one place, so each rule is written once.

/// CEL: the CIDR strings `a` and `b` (expressions) do not overlap. Invalid CIDRs are left to
/// their own syntax rules, so this rule never errors on them.
pub fn cidrs_disjoint(a: &str, b: &str) -> String {
    format!(
        "(!isCIDR({a}) || !isCIDR({b}) || !(cidr({a}).containsIP(cidr({b}).masked().ip()) || cidr({b}).containsIP(cidr({a}).masked().ip())))"
    )
}

/// CEL: no CIDR of list `a` overlaps one of list `b` (both list expressions).
pub fn subnets_disjoint(a: &str, b: &str) -> String {
    format!("{a}.all(x, {b}.all(y, {}))", cidrs_disjoint("x", "y"))
}

/// CEL, on a TalosCluster spec: the discovery ranges overlap neither pod nor service subnets.
pub fn discovery_disjoint_from_network() -> String {
    format!(
        "!has(self.discovery) || ({} && {})",
        subnets_disjoint("self.discovery.cidrs", "self.network.podSubnets"),
        subnets_disjoint("self.discovery.cidrs", "self.network.serviceSubnets")
    )
}
