//! What a call to a BMC can fail with: one variant per cause a person acts on differently, each
//! with a stable [`reason`](Error::reason) for a condition. No variant ever carries a password:
//! errors name the endpoint (its origin) and, where one answered, the resource's path.

/// A failed call to a BMC, or an endpoint that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint's settings cannot be used (a URL that does not parse, plain HTTP without the
    /// opt-in, a CA bundle with no certificate, a limit of zero).
    #[error("the BMC endpoint {endpoint} cannot be used: {detail}")]
    InvalidEndpoint {
        /// The endpoint as given (a URL whose credentials, if any, are left out).
        endpoint: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The BMC refused the credentials (401 or 403).
    #[error("the BMC at {endpoint} refused user {username} on {path} ({status})")]
    Unauthorized {
        /// The endpoint's origin.
        endpoint: String,
        /// The user the request named.
        username: String,
        /// The resource asked for.
        path: String,
        /// 401 or 403.
        status: u16,
    },
    /// The BMC did not answer: no connection, or no answer within the request's time limit.
    #[error("the BMC at {endpoint} did not answer: {detail}")]
    Unreachable {
        /// The endpoint's origin.
        endpoint: String,
        /// What the connection saw.
        detail: String,
    },
    /// The BMC's certificate was not trusted (not signed by the endpoint's CA, or not for its
    /// address).
    #[error("the BMC at {endpoint} presented a certificate that is not trusted: {detail}")]
    Untrusted {
        /// The endpoint's origin.
        endpoint: String,
        /// What the TLS handshake reported.
        detail: String,
    },
    /// The resource does not exist (404).
    #[error("the BMC at {endpoint} has no {path} (404)")]
    NotFound {
        /// The endpoint's origin.
        endpoint: String,
        /// The resource asked for.
        path: String,
    },
    /// The BMC refused the request (a 4xx other than 401, 403 and 404), with its messages.
    #[error("the BMC at {endpoint} refused {method} {path} ({status}){}", said(.messages))]
    Refused {
        /// The endpoint's origin.
        endpoint: String,
        /// The request's method.
        method: String,
        /// The resource asked for.
        path: String,
        /// The HTTP status.
        status: u16,
        /// The Redfish messages of its answer (`error.@Message.ExtendedInfo[].Message`, else
        /// `error.message`).
        messages: Vec<String>,
    },
    /// The BMC failed the request (5xx), with its messages.
    #[error("the BMC at {endpoint} failed {method} {path} ({status}){}", said(.messages))]
    ServerError {
        /// The endpoint's origin.
        endpoint: String,
        /// The request's method.
        method: String,
        /// The resource asked for.
        path: String,
        /// The HTTP status.
        status: u16,
        /// The Redfish messages of its answer.
        messages: Vec<String>,
    },
    /// The BMC answered, but not in the shape Redfish defines (naming the field).
    #[error("the BMC at {endpoint} answered {path} with {detail}")]
    Protocol {
        /// The endpoint's origin.
        endpoint: String,
        /// The resource asked for.
        path: String,
        /// What did not read, and where.
        detail: String,
    },
    /// The BMC's answer was larger than the endpoint's limit.
    #[error("the BMC at {endpoint} answered {path} with more than {limit} bytes")]
    TooLarge {
        /// The endpoint's origin.
        endpoint: String,
        /// The resource asked for.
        path: String,
        /// The limit, in bytes.
        limit: usize,
    },
    /// The BMC does not offer what was asked (no such action, a reset type it does not list, no
    /// CD or DVD virtual media).
    #[error("the BMC at {endpoint} does not offer {detail}")]
    Unsupported {
        /// The endpoint's origin.
        endpoint: String,
        /// What it lacks.
        detail: String,
    },
}

/// `: message; message` when the BMC said anything, else nothing.
fn said(messages: &[String]) -> String {
    if messages.is_empty() {
        String::new()
    } else {
        format!(": {}", messages.join("; "))
    }
}

impl Error {
    /// A stable CamelCase word for the cause, fit for a condition's reason.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidEndpoint { .. } => "BmcEndpointInvalid",
            Self::Unauthorized { .. } => "BmcUnauthorized",
            Self::Unreachable { .. } => "BmcUnreachable",
            Self::Untrusted { .. } => "BmcCertificateUntrusted",
            Self::NotFound { .. } => "BmcResourceNotFound",
            Self::Refused { .. } => "BmcRefused",
            Self::ServerError { .. } => "BmcServerError",
            Self::Protocol { .. } => "BmcProtocolError",
            Self::TooLarge { .. } => "BmcAnswerTooLarge",
            Self::Unsupported { .. } => "BmcUnsupported",
        }
    }

    /// Whether trying again later may succeed without anyone changing a setting: the BMC did
    /// not answer, or failed on its side.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unreachable { .. } | Self::ServerError { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of each cause that names no request.
    fn endpoint_errors(endpoint: &str) -> Vec<Error> {
        let endpoint = || endpoint.to_owned();
        vec![
            Error::InvalidEndpoint {
                endpoint: endpoint(),
                detail: String::new(),
            },
            Error::Unreachable {
                endpoint: endpoint(),
                detail: String::new(),
            },
            Error::Untrusted {
                endpoint: endpoint(),
                detail: String::new(),
            },
            Error::Unsupported {
                endpoint: endpoint(),
                detail: String::new(),
            },
        ]
    }

    /// One error of each cause that names the resource asked for.
    fn request_errors(endpoint: &str, path: &str) -> Vec<Error> {
        let (endpoint, path) = (|| endpoint.to_owned(), || path.to_owned());
        vec![
            Error::Unauthorized {
                endpoint: endpoint(),
                username: "admin".into(),
                path: path(),
                status: 401,
            },
            Error::NotFound {
                endpoint: endpoint(),
                path: path(),
            },
            Error::Refused {
                endpoint: endpoint(),
                method: "POST".into(),
                path: path(),
                status: 400,
                messages: Vec::new(),
            },
            Error::ServerError {
                endpoint: endpoint(),
                method: "GET".into(),
                path: path(),
                status: 500,
                messages: Vec::new(),
            },
            Error::Protocol {
                endpoint: endpoint(),
                path: path(),
                detail: String::new(),
            },
            Error::TooLarge {
                endpoint: endpoint(),
                path: path(),
                limit: 1,
            },
        ]
    }

    #[test]
    fn each_cause_has_its_own_reason() {
        let mut errors = endpoint_errors("https://10.0.0.5");
        errors.extend(request_errors("https://10.0.0.5", "/redfish/v1/Systems"));
        let mut reasons: Vec<&str> = errors.iter().map(Error::reason).collect();
        assert!(
            reasons
                .iter()
                .all(|r| r.starts_with("Bmc") && r.chars().all(|c| c.is_ascii_alphanumeric()))
        );
        reasons.sort_unstable();
        reasons.dedup();
        assert_eq!(reasons.len(), errors.len(), "a reason names one cause");
        assert_eq!(reasons.len(), 10, "every variant is here");
    }

    #[test]
    fn a_refusal_says_what_the_bmc_said() {
        let refused = Error::Refused {
            endpoint: "https://10.0.0.5".into(),
            method: "POST".into(),
            path: "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset".into(),
            status: 400,
            messages: vec!["The value 'Sleep' for ResetType is not in the list".into()],
        };
        assert_eq!(
            refused.to_string(),
            "the BMC at https://10.0.0.5 refused POST /redfish/v1/Systems/1/Actions/ComputerSystem.Reset (400): The value 'Sleep' for ResetType is not in the list"
        );
        assert!(!refused.is_transient());
    }
}
