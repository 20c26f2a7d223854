//! The Redfish service's HTTP side: routing by URI and method, authentication, the headers
//! every response carries, ETags, conditional requests and the bound on request bodies. The
//! resources are rendered in `resources`, the actions run in `actions`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use serde_json::{Map, Value};

use super::errors::{Message, error};
use super::resources::{self as res, Kind, kinds};
use super::sessions::Caller;
use super::{Service, accounts, actions};

/// The largest request body read; past it the request is refused with 413.
pub(crate) const MAX_BODY: usize = 64 * 1024;

/// The service as an axum app.
pub(crate) fn router(service: Arc<Service>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(service)
}

/// Every request: held while the BMC is unresponsive, then answered, with `OData-Version`.
async fn handle(State(service): State<Arc<Service>>, request: Request) -> Response {
    service.requests.fetch_add(1, Ordering::SeqCst);
    let mut held = service.unresponsive.subscribe();
    let _ = held.wait_for(|unresponsive| !*unresponsive).await;
    let mut response = respond(&service, request).await;
    response
        .headers_mut()
        .insert("odata-version", HeaderValue::from_static("4.0"));
    response
}

/// A URI the service serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    Versions,
    Root,
    OData,
    Metadata,
    Systems,
    System,
    Reset,
    Managers,
    Manager,
    Media,
    Cd,
    Insert,
    Eject,
    SessionService,
    Sessions,
    /// `Sessions/Members`: a `POST` there creates a session as on the collection (DSP0266).
    SessionMembers,
    Session(String),
    AccountService,
    Accounts,
    /// `Accounts/Members`: a `POST` there creates an account as on the collection.
    AccountMembers,
    Account(String),
    Roles,
    Role(&'static str, &'static [&'static str]),
}

impl Route {
    /// The route of `path` (a trailing `/` and a percent-encoded `$` are read as the same).
    fn of(path: &str) -> Option<Self> {
        let path = path.replace("%24", "$");
        let path = if path.len() > 1 {
            path.trim_end_matches('/')
        } else {
            path.as_str()
        };
        let fixed = [
            ("/redfish", Self::Versions),
            ("/redfish/v1", Self::Root),
            ("/redfish/v1/odata", Self::OData),
            ("/redfish/v1/$metadata", Self::Metadata),
            (res::SYSTEMS, Self::Systems),
            (res::SYSTEM, Self::System),
            (res::RESET, Self::Reset),
            (res::MANAGERS, Self::Managers),
            (res::MANAGER, Self::Manager),
            (res::MEDIA, Self::Media),
            (res::CD, Self::Cd),
            (res::INSERT, Self::Insert),
            (res::EJECT, Self::Eject),
            (res::SESSION_SERVICE, Self::SessionService),
            (res::SESSIONS, Self::Sessions),
            (
                "/redfish/v1/SessionService/Sessions/Members",
                Self::SessionMembers,
            ),
            (res::ACCOUNT_SERVICE, Self::AccountService),
            (res::ACCOUNTS, Self::Accounts),
            (
                "/redfish/v1/AccountService/Accounts/Members",
                Self::AccountMembers,
            ),
            (res::ROLES, Self::Roles),
        ];
        if let Some((_, route)) = fixed.into_iter().find(|(p, _)| *p == path) {
            return Some(route);
        }
        if let Some(id) = path.strip_prefix("/redfish/v1/SessionService/Sessions/") {
            let hex = !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit());
            return hex.then(|| Self::Session(id.to_owned()));
        }
        if let Some(id) = path.strip_prefix("/redfish/v1/AccountService/Accounts/") {
            let number = !id.is_empty() && id.len() <= 4 && id.bytes().all(|b| b.is_ascii_digit());
            return number.then(|| Self::Account(id.to_owned()));
        }
        let id = path.strip_prefix("/redfish/v1/AccountService/Roles/")?;
        res::ROLE_PRIVILEGES
            .iter()
            .find(|(role, _)| *role == id)
            .map(|(role, privileges)| Self::Role(role, privileges))
    }

    /// Whether it is read without authentication (DSP0266: the service root, `/redfish`, the
    /// OData documents).
    fn public(&self) -> bool {
        matches!(
            self,
            Self::Versions | Self::Root | Self::OData | Self::Metadata
        )
    }

    /// The methods it allows.
    fn allowed(&self) -> &'static [Method] {
        const READ: &[Method] = &[Method::GET, Method::HEAD];
        match self {
            Self::System => &[Method::GET, Method::HEAD, Method::PATCH],
            Self::Reset
            | Self::Insert
            | Self::Eject
            | Self::SessionMembers
            | Self::AccountMembers => &[Method::POST],
            Self::Sessions | Self::Accounts => &[Method::GET, Method::HEAD, Method::POST],
            Self::Account(_) => &[Method::GET, Method::HEAD, Method::PATCH, Method::DELETE],
            Self::Session(_) => &[Method::GET, Method::HEAD, Method::DELETE],
            _ => READ,
        }
    }

    /// The `Allow` header's value.
    fn allow(&self) -> String {
        self.allowed()
            .iter()
            .map(Method::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A JSON response.
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    (
        status,
        [(header::CONTENT_TYPE, "application/json;charset=utf-8")],
        bytes,
    )
        .into_response()
}

/// The request before its body is read, and who sent it (none for the public resources and a
/// login).
struct Asked {
    method: Method,
    headers: HeaderMap,
    path: String,
    caller: Option<Caller>,
}

async fn respond(service: &Service, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let mut asked = Asked {
        method: parts.method,
        headers: parts.headers,
        path: parts.uri.path().to_owned(),
        caller: None,
    };
    if let Some(refused) = refuse_headers(&asked.headers, parts.uri.query()) {
        return refused;
    }
    let route = Route::of(&asked.path);
    let login = matches!(route, Some(Route::Sessions | Route::SessionMembers))
        && asked.method == Method::POST;
    let public = route.as_ref().is_some_and(Route::public);
    if !public && !login {
        asked.caller = service.logins.caller(&asked.headers);
        if asked.caller.is_none() {
            return unauthorized();
        }
    }
    let Some(route) = route else {
        return error(StatusCode::NOT_FOUND, &[Message::missing(&asked.path)]);
    };
    if !route.allowed().contains(&asked.method) {
        let mut response = error(StatusCode::METHOD_NOT_ALLOWED, &[Message::not_allowed()]);
        if let Ok(allow) = HeaderValue::from_str(&route.allow()) {
            response.headers_mut().insert(header::ALLOW, allow);
        }
        return response;
    }
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        return error(StatusCode::PAYLOAD_TOO_LARGE, &[Message::too_large()]);
    };
    dispatch(service, &route, &asked, &body).await
}

/// Refuses a request whose `OData-Version` is not 4.0 (412), or that asks for a `$` query
/// parameter (501: none is supported; other parameters are ignored).
fn refuse_headers(headers: &HeaderMap, query: Option<&str>) -> Option<Response> {
    if let Some(version) = headers.get("odata-version")
        && version.as_bytes() != b"4.0"
    {
        return Some(error(
            StatusCode::PRECONDITION_FAILED,
            &[Message::header_invalid("OData-Version")],
        ));
    }
    let dollar = query?
        .split('&')
        .map(|pair| {
            pair.split('=')
                .next()
                .unwrap_or_default()
                .replace("%24", "$")
        })
        .find(|key| key.starts_with('$'))?;
    Some(error(
        StatusCode::NOT_IMPLEMENTED,
        &[Message::query_unsupported(&dollar)],
    ))
}

/// 401, with the scheme a client can authenticate with.
fn unauthorized() -> Response {
    let mut response = error(StatusCode::UNAUTHORIZED, &[Message::no_session()]);
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"ichor-sim BMC\""),
    );
    response
}

async fn dispatch(service: &Service, route: &Route, asked: &Asked, body: &Bytes) -> Response {
    if !permitted(route, asked) {
        return error(StatusCode::FORBIDDEN, &[Message::insufficient_privilege()]);
    }
    if matches!(asked.method, Method::POST | Method::PATCH) {
        let Some(object) = object(body) else {
            return error(StatusCode::BAD_REQUEST, &[Message::malformed()]);
        };
        return write(service, route, asked, &object).await;
    }
    match (route, &asked.method) {
        (Route::Account(id), &Method::DELETE) => match &asked.caller {
            Some(caller) => accounts::delete(service, caller, id),
            None => unauthorized(),
        },
        (Route::Session(id), &Method::DELETE) => {
            if service.logins.close(id) {
                StatusCode::NO_CONTENT.into_response()
            } else {
                error(StatusCode::NOT_FOUND, &[Message::missing(&asked.path)])
            }
        }
        (Route::Metadata, _) => metadata(asked),
        _ => match read(service, route).await {
            Some((value, kind)) => resource(asked, route, &value, kind),
            None => error(StatusCode::NOT_FOUND, &[Message::missing(&asked.path)]),
        },
    }
}

/// A `POST` or `PATCH` whose body is a JSON object: the routes that allow one.
async fn write(
    service: &Service,
    route: &Route,
    asked: &Asked,
    object: &Map<String, Value>,
) -> Response {
    match (route, &asked.caller) {
        (Route::Accounts | Route::AccountMembers, Some(caller)) => {
            accounts::create(service, caller, object)
        }
        (Route::Account(id), Some(caller)) => {
            accounts::patch(service, caller, id, &asked.headers, object)
        }
        _ => write_machine(service, route, asked, object).await,
    }
}

/// A write to the machine's resources, or a login.
async fn write_machine(
    service: &Service,
    route: &Route,
    asked: &Asked,
    object: &Map<String, Value>,
) -> Response {
    match route {
        Route::System => actions::patch_system(service, &asked.headers, object).await,
        Route::Reset => actions::reset(service, object).await,
        Route::Insert => actions::insert(service, object),
        Route::Eject => actions::eject(service, object),
        _ => log_in(service, object),
    }
}

/// Whether the caller's role allows the request (DSP0266's predefined privileges): reads need
/// `Login`, the machine's writes `ConfigureComponents`, ending another's session
/// `ConfigureManager`; account writes are checked where they are made (`accounts`).
fn permitted(route: &Route, asked: &Asked) -> bool {
    let Some(caller) = &asked.caller else {
        return true;
    };
    let privilege = match (route, &asked.method) {
        (
            Route::System | Route::Reset | Route::Insert | Route::Eject,
            &Method::PATCH | &Method::POST,
        ) => "ConfigureComponents",
        (Route::Session(id), &Method::DELETE) if caller.session.as_deref() != Some(id.as_str()) => {
            "ConfigureManager"
        }
        (Route::Session(_), &Method::DELETE) => "ConfigureSelf",
        _ => "Login",
    };
    caller.may(privilege)
}

/// A request body as a JSON object (an empty body is an empty object), or `None`.
fn object(body: &Bytes) -> Option<Map<String, Value>> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Some(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Some(object),
        _ => None,
    }
}

/// The representation of a readable route, and its type.
async fn read(service: &Service, route: &Route) -> Option<(Value, Option<Kind>)> {
    let members = |uris: &[&str]| -> Vec<String> { uris.iter().map(|u| (*u).to_owned()).collect() };
    let found = match route {
        Route::Versions => (res::versions(), None),
        Route::Root => (
            res::service_root(&service.service_uuid),
            Some(kinds::SERVICE_ROOT),
        ),
        Route::OData => (res::odata(), None),
        Route::Systems => (
            res::collection(
                kinds::SYSTEMS,
                res::SYSTEMS,
                "Computer System Collection",
                &members(&[res::SYSTEM]),
            ),
            Some(kinds::SYSTEMS),
        ),
        Route::System => (
            res::system(&actions::system_view(service).await?),
            Some(kinds::SYSTEM),
        ),
        Route::Managers => (
            res::collection(
                kinds::MANAGERS,
                res::MANAGERS,
                "Manager Collection",
                &members(&[res::MANAGER]),
            ),
            Some(kinds::MANAGERS),
        ),
        Route::Manager => (
            res::manager(&service.manager_uuid, &service.service_uuid),
            Some(kinds::MANAGER),
        ),
        Route::Media => (
            res::collection(
                kinds::MEDIA,
                res::MEDIA,
                "Virtual Media Collection",
                &members(&[res::CD]),
            ),
            Some(kinds::MEDIA),
        ),
        Route::Cd => (res::cd(&service.firmware.lock()), Some(kinds::CD)),
        _ => return read_security(service, route),
    };
    Some(found)
}

/// The session and account resources.
fn read_security(service: &Service, route: &Route) -> Option<(Value, Option<Kind>)> {
    let found = match route {
        Route::SessionService => (res::session_service(), Some(kinds::SESSION_SERVICE)),
        Route::Sessions => {
            let uris: Vec<String> = service
                .logins
                .ids()
                .iter()
                .map(|id| res::session_uri(id))
                .collect();
            (
                res::collection(kinds::SESSIONS, res::SESSIONS, "Session Collection", &uris),
                Some(kinds::SESSIONS),
            )
        }
        Route::Session(id) => (
            res::session(&service.logins.session(id)?),
            Some(kinds::SESSION),
        ),
        Route::AccountService => (res::account_service(), Some(kinds::ACCOUNT_SERVICE)),
        Route::Accounts => {
            let uris: Vec<String> = service
                .logins
                .account_ids()
                .iter()
                .map(|id| res::account_uri(id))
                .collect();
            (
                res::collection(kinds::ACCOUNTS, res::ACCOUNTS, "Account Collection", &uris),
                Some(kinds::ACCOUNTS),
            )
        }
        Route::Account(id) => (
            res::account(&service.logins.account(id)?),
            Some(kinds::ACCOUNT),
        ),
        Route::Roles => {
            let uris: Vec<String> = res::ROLE_PRIVILEGES
                .iter()
                .map(|(id, _)| res::role_uri(id))
                .collect();
            (
                res::collection(kinds::ROLES, res::ROLES, "Role Collection", &uris),
                Some(kinds::ROLES),
            )
        }
        Route::Role(id, privileges) => (res::role(id, privileges), Some(kinds::ROLE)),
        _ => return None,
    };
    Some(found)
}

/// The strong ETag of a representation: a digest of its bytes.
pub(crate) fn etag(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let hex: String = digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("\"{hex}\"")
}

/// A resource's representation with its `@odata.etag`, and that ETag: a digest of the
/// representation without it, so that the header and the property agree.
pub(crate) fn tagged(value: &Value) -> (Value, String) {
    let tag = etag(&serde_json::to_vec(value).unwrap_or_default());
    let mut tagged = value.clone();
    if let Some(object) = tagged.as_object_mut() {
        object.insert("@odata.etag".to_owned(), Value::String(tag.clone()));
    }
    (tagged, tag)
}

/// Whether the request's `If-Match` (absent: yes) names `etag`, by strong comparison.
pub(crate) fn if_match(headers: &HeaderMap, etag: &str) -> bool {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return true;
    };
    let value = value.to_str().unwrap_or_default();
    value
        .split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag == etag)
}

/// A resource read with GET or HEAD: its representation and the headers DSP0266 asks for
/// (`ETag`, `Allow`, `Cache-Control`, `Link` to its schema); 304 when `If-None-Match` names
/// its ETag.
fn resource(asked: &Asked, route: &Route, value: &Value, kind: Option<Kind>) -> Response {
    let (value, tag) = if kind.is_some_and(Kind::versioned) {
        tagged(value)
    } else {
        (
            value.clone(),
            etag(&serde_json::to_vec(value).unwrap_or_default()),
        )
    };
    let unchanged = asked
        .headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').map(str::trim).any(|t| t == "*" || t == tag));
    let mut response = if unchanged {
        StatusCode::NOT_MODIFIED.into_response()
    } else if asked.method == Method::HEAD {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json;charset=utf-8")],
        )
            .into_response()
    } else {
        json_response(StatusCode::OK, &value)
    };
    let headers = response.headers_mut();
    let mut set = |name: header::HeaderName, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(name, value);
        }
    };
    set(header::ETAG, &tag);
    set(header::ALLOW, &route.allow());
    set(header::CACHE_CONTROL, "no-cache");
    if let Some(kind) = kind {
        set(
            header::LINK,
            &format!("<{}>; rel=describedby", kind.schema()),
        );
    }
    response
}

/// `$metadata`, as XML.
fn metadata(asked: &Asked) -> Response {
    let body = if asked.method == Method::HEAD {
        Body::empty()
    } else {
        Body::from(res::metadata())
    };
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml;charset=utf-8"),
    );
    headers.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `POST Sessions`: a session for the account's credentials (201, `Location`,
/// `X-Auth-Token`, the session), or 401.
fn log_in(service: &Service, credentials: &Map<String, Value>) -> Response {
    let field = |name: &str| credentials.get(name).and_then(Value::as_str);
    let (Some(username), Some(password)) = (field("UserName"), field("Password")) else {
        let missing = if field("UserName").is_none() {
            "UserName"
        } else {
            "Password"
        };
        return error(
            StatusCode::BAD_REQUEST,
            &[Message::property_missing(missing).about(&format!("#/{missing}"))],
        );
    };
    let Some(account) = service.logins.check(username, password) else {
        return unauthorized();
    };
    let (session, token) = service.logins.open(&account);
    let (value, _) = tagged(&res::session(&session));
    let mut response = json_response(StatusCode::CREATED, &value);
    let headers = response.headers_mut();
    if let (Ok(location), Ok(token)) = (
        HeaderValue::from_str(&res::session_uri(&session.id)),
        HeaderValue::from_str(&token),
    ) {
        headers.insert(header::LOCATION, location);
        headers.insert("x-auth-token", token);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_read_trailing_slashes_and_encoded_dollars_alike() {
        assert_eq!(Route::of("/redfish/v1/"), Some(Route::Root));
        assert_eq!(Route::of("/redfish/v1"), Some(Route::Root));
        assert_eq!(Route::of("/redfish/v1/%24metadata"), Some(Route::Metadata));
        assert_eq!(
            Route::of("/redfish/v1/Systems/system/"),
            Some(Route::System)
        );
        assert_eq!(
            Route::of("/redfish/v1/SessionService/Sessions/0a1b"),
            Some(Route::Session("0a1b".into()))
        );
        assert_eq!(Route::of("/redfish/v1/SessionService/Sessions/../x"), None);
        assert_eq!(Route::of("/redfish/v1/Systems/other"), None);
        assert!(matches!(
            Route::of("/redfish/v1/AccountService/Roles/ReadOnly"),
            Some(Route::Role("ReadOnly", _))
        ));
    }

    #[test]
    fn allow_lists_the_methods() {
        assert_eq!(Route::System.allow(), "GET, HEAD, PATCH");
        assert_eq!(Route::Reset.allow(), "POST");
    }

    #[test]
    fn if_match_compares_strongly() {
        let mut headers = HeaderMap::new();
        assert!(if_match(&headers, "\"a\""));
        headers.insert(header::IF_MATCH, HeaderValue::from_static("W/\"a\""));
        assert!(!if_match(&headers, "\"a\""));
        headers.insert(header::IF_MATCH, HeaderValue::from_static("\"b\", \"a\""));
        assert!(if_match(&headers, "\"a\""));
    }

    #[test]
    fn dollar_parameters_are_not_implemented_and_others_ignored() {
        let headers = HeaderMap::new();
        assert!(refuse_headers(&headers, Some("rpvunknown")).is_none());
        let refused = refuse_headers(&headers, Some("$expand=*")).unwrap();
        assert_eq!(refused.status(), StatusCode::NOT_IMPLEMENTED);
        let mut old = HeaderMap::new();
        old.insert("odata-version", HeaderValue::from_static("4.1"));
        assert_eq!(
            refuse_headers(&old, None).unwrap().status(),
            StatusCode::PRECONDITION_FAILED
        );
    }
}
