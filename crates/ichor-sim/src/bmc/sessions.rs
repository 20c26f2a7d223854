//! The BMC's one account and its login sessions (Redfish `SessionService`): a session is made
//! by a `POST` of the credentials and used with its `X-Auth-Token`; HTTP basic authentication
//! works on every request as well.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use axum::http::HeaderMap;
use base64::Engine as _;
use rand::RngCore as _;

/// How many sessions the BMC keeps; a new one beyond that ends the oldest.
const MAX_SESSIONS: usize = 32;

/// One login session.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// Its id, the last segment of its URI.
    pub(crate) id: String,
    /// The account's user name.
    pub(crate) user: String,
    token: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// The account's credentials.
#[derive(Clone, PartialEq, Eq)]
struct Account {
    username: String,
    password: String,
}

/// The account and its sessions.
pub(crate) struct Logins {
    account: Mutex<Account>,
    sessions: Mutex<VecDeque<Session>>,
}

impl std::fmt::Debug for Logins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logins")
            .field("user", &self.username())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Random bytes as lowercase hex.
fn random_hex(bytes: usize) -> String {
    let mut buffer = vec![0_u8; bytes];
    rand::rng().fill_bytes(&mut buffer);
    buffer.iter().map(|b| format!("{b:02x}")).collect()
}

impl Logins {
    /// An account `username` with `password`, no sessions.
    pub(crate) fn new(username: &str, password: &str) -> Self {
        Self {
            account: Mutex::new(Account {
                username: username.to_owned(),
                password: password.to_owned(),
            }),
            sessions: Mutex::new(VecDeque::new()),
        }
    }

    /// The account's user name.
    pub(crate) fn username(&self) -> String {
        lock(&self.account).username.clone()
    }

    /// Changes the account's password; its sessions end.
    pub(crate) fn set_password(&self, password: &str) {
        password.clone_into(&mut lock(&self.account).password);
        lock(&self.sessions).clear();
    }

    /// Whether `username` and `password` are the account's.
    pub(crate) fn check(&self, username: &str, password: &str) -> bool {
        let account = lock(&self.account);
        account.username == username && account.password == password
    }

    /// Whether a request with `headers` is the account's: by its `X-Auth-Token` when it has
    /// one, else by its basic credentials.
    pub(crate) fn authenticated(&self, headers: &HeaderMap) -> bool {
        self.authenticate(headers).is_some()
    }

    fn authenticate(&self, headers: &HeaderMap) -> Option<()> {
        if let Some(token) = headers.get("x-auth-token") {
            let token = token.to_str().ok()?;
            return lock(&self.sessions)
                .iter()
                .any(|s| s.token == token)
                .then_some(());
        }
        let value = headers
            .get(axum::http::header::AUTHORIZATION)?
            .to_str()
            .ok()?;
        let (scheme, encoded) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()?;
        let decoded = String::from_utf8(decoded).ok()?;
        let (username, password) = decoded.split_once(':')?;
        self.check(username, password).then_some(())
    }

    /// A new session for the account, and its token.
    pub(crate) fn open(&self) -> (Session, String) {
        let session = Session {
            id: random_hex(8),
            user: self.username(),
            token: random_hex(32),
        };
        let mut sessions = lock(&self.sessions);
        while sessions.len() >= MAX_SESSIONS {
            sessions.pop_front();
        }
        sessions.push_back(session.clone());
        let token = session.token.clone();
        (session, token)
    }

    /// The session `id`.
    pub(crate) fn session(&self, id: &str) -> Option<Session> {
        lock(&self.sessions).iter().find(|s| s.id == id).cloned()
    }

    /// Every session's id, oldest first.
    pub(crate) fn ids(&self) -> Vec<String> {
        lock(&self.sessions).iter().map(|s| s.id.clone()).collect()
    }

    /// Ends the session `id`; whether there was one.
    pub(crate) fn close(&self, id: &str) -> bool {
        let mut sessions = lock(&self.sessions);
        let before = sessions.len();
        sessions.retain(|s| s.id != id);
        sessions.len() != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_session_token_and_basic_credentials_both_identify_the_account() {
        let logins = Logins::new("admin", "secret");
        let (_, token) = logins.open();
        let mut headers = HeaderMap::new();
        headers.insert("x-auth-token", HeaderValue::from_str(&token).unwrap());
        assert!(logins.authenticated(&headers));
        let mut basic = HeaderMap::new();
        basic.insert(
            "authorization",
            HeaderValue::from_static("Basic YWRtaW46c2VjcmV0"),
        );
        assert!(logins.authenticated(&basic));
        logins.set_password("other");
        assert!(!logins.authenticated(&basic));
        assert!(
            !logins.authenticated(&headers),
            "sessions end with the password"
        );
    }

    #[test]
    fn sessions_are_bounded() {
        let logins = Logins::new("a", "b");
        for _ in 0..MAX_SESSIONS + 5 {
            logins.open();
        }
        assert_eq!(logins.ids().len(), MAX_SESSIONS);
    }
}
