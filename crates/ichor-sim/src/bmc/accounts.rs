//! The `AccountService`'s writes: accounts made (`POST` on the collection), changed (`PATCH`,
//! with `If-Match`) and deleted, under DSP0266's predefined roles: `ConfigureUsers` for any
//! account, `ConfigureSelf` for one's own password. The first account (the one the BMC was set
//! up with) can be neither deleted nor disabled. Each write is checked whole under the lock of
//! the accounts, so concurrent writes with one ETag see one winner.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use serde_json::{Map, Value};

use super::Service;
use super::errors::{Message, error};
use super::http::{if_match, json_response, tagged};
use super::resources::{self as res, ROLE_PRIVILEGES};
use super::sessions::{Account, Caller, FIRST, MAX_ACCOUNTS};

/// The longest user name and password taken.
const MAX_FIELD: usize = 64;

fn forbidden() -> Response {
    error(StatusCode::FORBIDDEN, &[Message::insufficient_privilege()])
}

fn annotation(name: &str) -> bool {
    name.contains('@')
}

/// A non-empty string of at most [`MAX_FIELD`] bytes, or the refusal.
/// A password is never repeated in a refusal.
fn text<'a>(name: &str, value: &'a Value) -> Result<&'a str, Message> {
    let shown = |v: String| {
        if name == "Password" {
            "******".to_owned()
        } else {
            v
        }
    };
    match value {
        Value::String(s) if !s.is_empty() && s.len() <= MAX_FIELD => Ok(s),
        Value::String(s) => {
            Err(Message::property_value_format(&shown(s.clone()), name).about(&format!("#/{name}")))
        }
        other => {
            Err(Message::property_type(&shown(other.to_string()), name).about(&format!("#/{name}")))
        }
    }
}

/// A predefined role's id, or the refusal.
fn role(value: &Value) -> Result<&'static str, Message> {
    let name = value.as_str().unwrap_or_default();
    ROLE_PRIVILEGES
        .iter()
        .find(|(id, _)| *id == name)
        .map(|(id, _)| *id)
        .ok_or_else(|| {
            let shown = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            Message::property_value_not_in_list(&shown, "RoleId").about("#/RoleId")
        })
}

/// A response carrying the account, tagged, with `status`.
fn account_response(status: StatusCode, account: &Account) -> Response {
    let (value, tag) = tagged(&res::account(account));
    let mut response = json_response(status, &value);
    if let Ok(tag) = HeaderValue::from_str(&tag) {
        response.headers_mut().insert(header::ETAG, tag);
    }
    response
}

/// `POST` on the accounts: `UserName`, `Password` and `RoleId` required, `Enabled` optional.
/// 201 with the account and its `Location`.
pub(crate) fn create(service: &Service, caller: &Caller, body: &Map<String, Value>) -> Response {
    if !caller.may("ConfigureUsers") {
        return forbidden();
    }
    let mut refusals: Vec<Message> = body
        .keys()
        .filter(|k| {
            !annotation(k) && !["UserName", "Password", "RoleId", "Enabled"].contains(&k.as_str())
        })
        .map(|k| Message::property_unknown(k).about(&format!("#/{k}")))
        .collect();
    let mut required = |name: &str| match body.get(name) {
        None => {
            refusals.push(Message::create_missing(name).about(&format!("#/{name}")));
            None
        }
        Some(value) => Some(value.clone()),
    };
    let (username, password, role_id) = (
        required("UserName"),
        required("Password"),
        required("RoleId"),
    );
    let username = username.and_then(|v| {
        text("UserName", &v)
            .map(str::to_owned)
            .map_err(|m| refusals.push(m))
            .ok()
    });
    let password = password.and_then(|v| {
        text("Password", &v)
            .map(str::to_owned)
            .map_err(|m| refusals.push(m))
            .ok()
    });
    let role_id = role_id.and_then(|v| role(&v).map_err(|m| refusals.push(m)).ok());
    let enabled = match body.get("Enabled") {
        None => true,
        Some(Value::Bool(on)) => *on,
        Some(other) => {
            refusals.push(Message::property_type(&other.to_string(), "Enabled").about("#/Enabled"));
            true
        }
    };
    let (Some(username), Some(password), Some(role_id)) = (username, password, role_id) else {
        return error(StatusCode::BAD_REQUEST, &refusals);
    };
    if !refusals.is_empty() {
        return error(StatusCode::BAD_REQUEST, &refusals);
    }
    let mut book = service.logins.lock();
    if book.accounts.iter().any(|a| a.username == username) {
        return error(
            StatusCode::CONFLICT,
            &[Message::already_exists(
                "ManagerAccount",
                "UserName",
                &username,
            )],
        );
    }
    if book.accounts.len() >= MAX_ACCOUNTS {
        return error(StatusCode::BAD_REQUEST, &[Message::create_limit()]);
    }
    book.last_id += 1;
    let mut account = Account::new(&book.last_id.to_string(), &username, &password, role_id);
    account.enabled = enabled;
    book.accounts.push(account.clone());
    drop(book);
    let mut response = account_response(StatusCode::CREATED, &account);
    if let Ok(location) = HeaderValue::from_str(&res::account_uri(&account.id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// What a `PATCH` of an account asks: the privilege it needs.
fn privilege_for(caller: &Caller, id: &str, body: &Map<String, Value>) -> &'static str {
    let only_password = body
        .keys()
        .filter(|k| !annotation(k))
        .all(|k| k == "Password");
    if only_password && caller.account == id {
        "ConfigureSelf"
    } else {
        "ConfigureUsers"
    }
}

/// `PATCH` of an account: `Password`, `RoleId`, `UserName`, `Enabled`. `If-Match` must name
/// the current ETag when given. 200 with the account as it is now.
pub(crate) fn patch(
    service: &Service,
    caller: &Caller,
    id: &str,
    headers: &HeaderMap,
    body: &Map<String, Value>,
) -> Response {
    if !caller.may(privilege_for(caller, id, body)) {
        return forbidden();
    }
    let mut book = service.logins.lock();
    let Some(index) = book.accounts.iter().position(|a| a.id == id) else {
        return error(
            StatusCode::NOT_FOUND,
            &[Message::missing(&res::account_uri(id))],
        );
    };
    let current = book.accounts[index].clone();
    let (_, tag) = tagged(&res::account(&current));
    if !if_match(headers, &tag) {
        return error(
            StatusCode::PRECONDITION_FAILED,
            &[Message::precondition_failed()],
        );
    }
    if body.keys().all(|k| annotation(k)) {
        return error(StatusCode::BAD_REQUEST, &[Message::no_operation()]);
    }
    let taken: Vec<String> = book
        .accounts
        .iter()
        .filter(|a| a.id != id)
        .map(|a| a.username.clone())
        .collect();
    let changed = match changed(&current, body, &taken) {
        Ok(changed) => changed,
        Err(refusals) => return error(StatusCode::BAD_REQUEST, &refusals),
    };
    let credentials = body.contains_key("Password") || !changed.enabled;
    book.accounts[index] = changed.clone();
    if credentials {
        book.end_sessions(id);
    }
    drop(book);
    account_response(StatusCode::OK, &changed)
}

/// `current` with `body`'s changes, or every refusal (`taken`: the other accounts' names).
fn changed(
    current: &Account,
    body: &Map<String, Value>,
    taken: &[String],
) -> Result<Account, Vec<Message>> {
    let shown = res::account(current);
    let mut account = current.clone();
    let mut refusals = Vec::new();
    for (name, value) in body.iter().filter(|(k, _)| !annotation(k)) {
        let outcome = match name.as_str() {
            "Password" => text(name, value).map(|p| account.set_password(p)),
            "RoleId" if current.id == FIRST => {
                Err(Message::property_not_writable(name).about("#/RoleId"))
            }
            "RoleId" => role(value).map(|r| account.role = r),
            "UserName" => text(name, value).and_then(|u| {
                if taken.iter().any(|t| t == u) {
                    Err(Message::already_exists("ManagerAccount", "UserName", u))
                } else {
                    u.clone_into(&mut account.username);
                    Ok(())
                }
            }),
            "Enabled" if current.id == FIRST => {
                Err(Message::property_not_writable(name).about("#/Enabled"))
            }
            "Enabled" => match value {
                Value::Bool(on) => {
                    account.enabled = *on;
                    Ok(())
                }
                other => Err(Message::property_type(&other.to_string(), name).about("#/Enabled")),
            },
            _ if shown.get(name).is_some() => {
                Err(Message::property_not_writable(name).about(&format!("#/{name}")))
            }
            _ => Err(Message::property_unknown(name).about(&format!("#/{name}"))),
        };
        if let Err(refusal) = outcome {
            refusals.push(refusal);
        }
    }
    if refusals.is_empty() {
        Ok(account)
    } else {
        Err(refusals)
    }
}

/// `DELETE` of an account (not the first one); its sessions end. 204.
pub(crate) fn delete(service: &Service, caller: &Caller, id: &str) -> Response {
    if !caller.may("ConfigureUsers") {
        return forbidden();
    }
    if id == FIRST {
        return error(StatusCode::BAD_REQUEST, &[Message::cannot_delete()]);
    }
    let mut book = service.logins.lock();
    let before = book.accounts.len();
    book.accounts.retain(|a| a.id != id);
    if book.accounts.len() == before {
        return error(
            StatusCode::NOT_FOUND,
            &[Message::missing(&res::account_uri(id))],
        );
    }
    book.end_sessions(id);
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    fn caller(account: &str, role: &'static str) -> Caller {
        Caller {
            account: account.into(),
            role,
            session: None,
        }
    }

    #[test]
    fn ones_own_password_needs_configure_self_and_anything_else_configure_users() {
        let password = object(json!({"Password": "x"}));
        let role = object(json!({"RoleId": "Operator"}));
        assert_eq!(
            privilege_for(&caller("2", "ReadOnly"), "2", &password),
            "ConfigureSelf"
        );
        assert_eq!(
            privilege_for(&caller("2", "ReadOnly"), "3", &password),
            "ConfigureUsers"
        );
        assert_eq!(
            privilege_for(&caller("2", "ReadOnly"), "2", &role),
            "ConfigureUsers"
        );
    }

    #[test]
    fn refusals_name_every_property_and_never_a_password() {
        let current = Account::new("2", "u", "p", "ReadOnly");
        let patch = object(json!({
            "Id": "9",
            "BogusProp": 1,
            "RoleId": "Root",
            "Password": "x".repeat(MAX_FIELD + 1),
            "UserName": "taken",
        }));
        let refused = changed(&current, &patch, &["taken".to_owned()]).unwrap_err();
        let ids: Vec<String> = refused
            .iter()
            .map(|m| m.to_json()["MessageId"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(ids.len(), 5, "{ids:?}");
        assert!(
            refused
                .iter()
                .all(|m| !m.to_json().to_string().contains(&"x".repeat(MAX_FIELD)))
        );
    }

    #[test]
    fn the_first_account_keeps_its_role_and_stays_enabled() {
        let first = Account::new(FIRST, "admin", "p", "Administrator");
        let patch = object(json!({"RoleId": "ReadOnly", "Enabled": false}));
        assert_eq!(changed(&first, &patch, &[]).unwrap_err().len(), 2);
    }
}
