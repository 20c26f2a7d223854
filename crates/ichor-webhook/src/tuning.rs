//! The check that `docs/tuning.md` states the webhook's defaults: every row that names an item
//! of this crate gives that item's value, and every such item is checked here, so a default
//! changed without the page (or the page without the code) fails. The flags' defaults and the
//! chart's are checked by the binary's own test.

use ichor_testenv::tuning::{assert_code_rows, shown};

use crate::{guard, server};

/// The webhook's values `docs/tuning.md` names by their code, as it writes them.
fn defaults() -> Vec<(&'static str, String)> {
    vec![
        (
            "ichor_webhook::guard::RESERVATION_TTL",
            shown(guard::RESERVATION_TTL),
        ),
        (
            "ichor_webhook::guard::ATTEMPTS",
            guard::ATTEMPTS.to_string(),
        ),
        (
            "ichor_webhook::server::DECISION_TIMEOUT",
            shown(server::DECISION_TIMEOUT),
        ),
    ]
}

#[test]
fn tuning_doc_states_the_webhook_defaults() {
    assert_code_rows(&defaults(), |named| named.starts_with("ichor_webhook::"));
}
