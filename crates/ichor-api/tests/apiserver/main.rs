//! Ichor's API against a real kube-apiserver: every CEL rule, the pruning of secret fields, the
//! kube-proxy-switch admission policy applied from its file, and the shipped examples.

mod support;

mod backup;
mod cluster;
mod examples;
mod kinds;
mod machine;
mod patches;
mod policy;
mod rollout;
