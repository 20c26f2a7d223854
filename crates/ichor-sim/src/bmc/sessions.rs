//! The BMC's accounts and their login sessions (Redfish `AccountService`, `SessionService`):
//! a session is made by a `POST` of an account's credentials and used with its `X-Auth-Token`;
//! HTTP basic authentication works on every request as well. The account the BMC was set up
//! with is `1`, an `Administrator` that cannot be deleted; others are made and changed through
//! the `AccountService` (`accounts`).

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use axum::http::HeaderMap;
use base64::Engine as _;
use rand::RngCore as _;

use super::resources::ROLE_PRIVILEGES;

/// How many sessions the BMC keeps; a new one beyond that ends the oldest.
const MAX_SESSIONS: usize = 32;
/// How many accounts it holds.
pub(crate) const MAX_ACCOUNTS: usize = 16;
/// The id of the account it was set up with.
pub(crate) const FIRST: &str = "1";

/// One login session.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// Its id, the last segment of its URI.
    pub(crate) id: String,
    /// The account's user name.
    pub(crate) user: String,
    /// The account's id.
    account: String,
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

/// One account.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Account {
    /// Its id, the last segment of its URI.
    pub(crate) id: String,
    /// `UserName`.
    pub(crate) username: String,
    password: String,
    /// `RoleId`: one of the predefined roles.
    pub(crate) role: &'static str,
    /// `Enabled`: only an enabled account logs in.
    pub(crate) enabled: bool,
}

impl Account {
    /// An account; `role` must be a predefined role's id.
    pub(crate) fn new(id: &str, username: &str, password: &str, role: &'static str) -> Self {
        Self {
            id: id.to_owned(),
            username: username.to_owned(),
            password: password.to_owned(),
            role,
            enabled: true,
        }
    }

    /// Changes its password.
    pub(crate) fn set_password(&mut self, password: &str) {
        password.clone_into(&mut self.password);
    }
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Account")
            .field("id", &self.id)
            .field("username", &self.username)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// The accounts and sessions.
#[derive(Debug, Default)]
pub(crate) struct Book {
    /// The accounts, the first one first.
    pub(crate) accounts: Vec<Account>,
    /// The last account id given.
    pub(crate) last_id: u32,
    sessions: VecDeque<Session>,
}

impl Book {
    /// Ends the sessions of account `id` (deleted, or its password changed).
    pub(crate) fn end_sessions(&mut self, id: &str) {
        self.sessions.retain(|s| s.account != id);
    }
}

/// The accounts and their sessions, behind one lock.
#[derive(Debug)]
pub(crate) struct Logins {
    book: Mutex<Book>,
}

/// Who a request is from: an account and its role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    /// The account's id.
    pub(crate) account: String,
    /// Its role.
    pub(crate) role: &'static str,
    /// The session it came with, if any.
    pub(crate) session: Option<String>,
}

impl Caller {
    /// Whether its role has `privilege` (DSP0266's predefined roles).
    pub(crate) fn may(&self, privilege: &str) -> bool {
        ROLE_PRIVILEGES
            .iter()
            .find(|(role, _)| *role == self.role)
            .is_some_and(|(_, privileges)| privileges.contains(&privilege))
    }
}

/// Random bytes as lowercase hex.
fn random_hex(bytes: usize) -> String {
    let mut buffer = vec![0_u8; bytes];
    rand::rng().fill_bytes(&mut buffer);
    buffer.iter().map(|b| format!("{b:02x}")).collect()
}

impl Logins {
    /// The first account, `username` with `password`, an `Administrator`; no sessions.
    pub(crate) fn new(username: &str, password: &str) -> Self {
        Self {
            book: Mutex::new(Book {
                accounts: vec![Account::new(FIRST, username, password, "Administrator")],
                last_id: 1,
                sessions: VecDeque::new(),
            }),
        }
    }

    /// The accounts and sessions, to read or change at once.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the first account's password; its sessions end.
    pub(crate) fn set_password(&self, password: &str) {
        let mut book = self.lock();
        if let Some(first) = book.accounts.iter_mut().find(|a| a.id == FIRST) {
            first.set_password(password);
        }
        book.end_sessions(FIRST);
    }

    /// The enabled account whose credentials these are.
    pub(crate) fn check(&self, username: &str, password: &str) -> Option<Account> {
        self.lock()
            .accounts
            .iter()
            .find(|a| a.enabled && a.username == username && a.password == password)
            .cloned()
    }

    /// Who sent a request with `headers`: by its `X-Auth-Token` when it has one, else by its
    /// basic credentials.
    pub(crate) fn caller(&self, headers: &HeaderMap) -> Option<Caller> {
        if let Some(token) = headers.get("x-auth-token") {
            let token = token.to_str().ok()?;
            let book = self.lock();
            let session = book.sessions.iter().find(|s| s.token == token)?;
            let account = book.accounts.iter().find(|a| a.id == session.account)?;
            return Some(Caller {
                account: account.id.clone(),
                role: account.role,
                session: Some(session.id.clone()),
            });
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
        let account = self.check(username, password)?;
        Some(Caller {
            account: account.id,
            role: account.role,
            session: None,
        })
    }

    /// A new session for `account`, and its token.
    pub(crate) fn open(&self, account: &Account) -> (Session, String) {
        let session = Session {
            id: random_hex(8),
            user: account.username.clone(),
            account: account.id.clone(),
            token: random_hex(32),
        };
        let mut book = self.lock();
        while book.sessions.len() >= MAX_SESSIONS {
            book.sessions.pop_front();
        }
        book.sessions.push_back(session.clone());
        let token = session.token.clone();
        (session, token)
    }

    /// The session `id`.
    pub(crate) fn session(&self, id: &str) -> Option<Session> {
        self.lock().sessions.iter().find(|s| s.id == id).cloned()
    }

    /// Every session's id, oldest first.
    pub(crate) fn ids(&self) -> Vec<String> {
        self.lock().sessions.iter().map(|s| s.id.clone()).collect()
    }

    /// Ends the session `id`; whether there was one.
    pub(crate) fn close(&self, id: &str) -> bool {
        let mut book = self.lock();
        let before = book.sessions.len();
        book.sessions.retain(|s| s.id != id);
        book.sessions.len() != before
    }

    /// The account `id`.
    pub(crate) fn account(&self, id: &str) -> Option<Account> {
        self.lock().accounts.iter().find(|a| a.id == id).cloned()
    }

    /// Every account's id, in order.
    pub(crate) fn account_ids(&self) -> Vec<String> {
        self.lock().accounts.iter().map(|a| a.id.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_session_token_and_basic_credentials_both_identify_the_account() {
        let logins = Logins::new("admin", "secret");
        let first = logins.check("admin", "secret").unwrap();
        let (session, token) = logins.open(&first);
        let mut headers = HeaderMap::new();
        headers.insert("x-auth-token", HeaderValue::from_str(&token).unwrap());
        let caller = logins.caller(&headers).unwrap();
        assert_eq!(caller.session, Some(session.id));
        assert!(caller.may("ConfigureUsers"));
        let mut basic = HeaderMap::new();
        basic.insert(
            "authorization",
            HeaderValue::from_static("Basic YWRtaW46c2VjcmV0"),
        );
        assert_eq!(logins.caller(&basic).unwrap().account, FIRST);
        logins.set_password("other");
        assert_eq!(logins.caller(&basic), None);
        assert_eq!(
            logins.caller(&headers),
            None,
            "sessions end with the password"
        );
    }

    #[test]
    fn sessions_are_bounded() {
        let logins = Logins::new("a", "b");
        let first = logins.check("a", "b").unwrap();
        for _ in 0..MAX_SESSIONS + 5 {
            logins.open(&first);
        }
        assert_eq!(logins.ids().len(), MAX_SESSIONS);
    }

    #[test]
    fn a_read_only_role_configures_only_itself() {
        let caller = Caller {
            account: "2".into(),
            role: "ReadOnly",
            session: None,
        };
        assert!(caller.may("Login") && caller.may("ConfigureSelf"));
        assert!(!caller.may("ConfigureComponents") && !caller.may("ConfigureUsers"));
    }
}
