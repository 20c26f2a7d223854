//! Redfish error responses: the status code and the `error` object with `code`, `message` and
//! `@Message.ExtendedInfo`, whose messages come from the DMTF Base message registry
//! (`Base.1.22`, `registries/Base.1.22.1.json` of DMTF's Redfish-Publications: each message's
//! text and severity as the registry gives them).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

/// The registry prefix of every message id.
const REGISTRY: &str = "Base.1.22";

/// One message of the Base registry, with its arguments filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    key: &'static str,
    args: Vec<String>,
    /// The JSON pointer of the property or parameter it is about, if any.
    related: Option<String>,
}

impl Message {
    fn new(key: &'static str, args: &[&str]) -> Self {
        Self {
            key,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            related: None,
        }
    }

    /// Names the property the message is about (`RelatedProperties`).
    pub(crate) fn about(mut self, pointer: &str) -> Self {
        self.related = Some(pointer.to_owned());
        self
    }

    /// `ResourceMissingAtURI`.
    pub(crate) fn missing(uri: &str) -> Self {
        Self::new("ResourceMissingAtURI", &[uri])
    }
    /// `OperationNotAllowed`.
    pub(crate) fn not_allowed() -> Self {
        Self::new("OperationNotAllowed", &[])
    }
    /// `NoValidSession`.
    pub(crate) fn no_session() -> Self {
        Self::new("NoValidSession", &[])
    }
    /// `InsufficientPrivilege`.
    pub(crate) fn insufficient_privilege() -> Self {
        Self::new("InsufficientPrivilege", &[])
    }
    /// `CreateFailedMissingReqProperties`.
    pub(crate) fn create_missing(property: &str) -> Self {
        Self::new("CreateFailedMissingReqProperties", &[property])
    }
    /// `ResourceAlreadyExists`.
    pub(crate) fn already_exists(kind: &str, property: &str, value: &str) -> Self {
        Self::new("ResourceAlreadyExists", &[kind, property, value])
    }
    /// `CreateLimitReachedForResource`.
    pub(crate) fn create_limit() -> Self {
        Self::new("CreateLimitReachedForResource", &[])
    }
    /// `ResourceCannotBeDeleted`.
    pub(crate) fn cannot_delete() -> Self {
        Self::new("ResourceCannotBeDeleted", &[])
    }
    /// `MalformedJSON`.
    pub(crate) fn malformed() -> Self {
        Self::new("MalformedJSON", &[])
    }
    /// `PayloadTooLarge`.
    pub(crate) fn too_large() -> Self {
        Self::new("PayloadTooLarge", &[])
    }
    /// `HeaderInvalid`.
    pub(crate) fn header_invalid(header: &str) -> Self {
        Self::new("HeaderInvalid", &[header])
    }
    /// `QueryParameterUnsupported`.
    pub(crate) fn query_unsupported(parameter: &str) -> Self {
        Self::new("QueryParameterUnsupported", &[parameter])
    }
    /// `PreconditionFailed`.
    pub(crate) fn precondition_failed() -> Self {
        Self::new("PreconditionFailed", &[])
    }
    /// `NoOperation`.
    pub(crate) fn no_operation() -> Self {
        Self::new("NoOperation", &[])
    }
    /// `PropertyUnknown`.
    pub(crate) fn property_unknown(property: &str) -> Self {
        Self::new("PropertyUnknown", &[property])
    }
    /// `PropertyNotWritable`.
    pub(crate) fn property_not_writable(property: &str) -> Self {
        Self::new("PropertyNotWritable", &[property])
    }
    /// `PropertyValueNotInList`.
    pub(crate) fn property_value_not_in_list(value: &str, property: &str) -> Self {
        Self::new("PropertyValueNotInList", &[value, property])
    }
    /// `PropertyValueTypeError`.
    pub(crate) fn property_type(value: &str, property: &str) -> Self {
        Self::new("PropertyValueTypeError", &[value, property])
    }
    /// `PropertyValueFormatError`.
    pub(crate) fn property_value_format(value: &str, property: &str) -> Self {
        Self::new("PropertyValueFormatError", &[value, property])
    }
    /// `PropertyMissing`.
    pub(crate) fn property_missing(property: &str) -> Self {
        Self::new("PropertyMissing", &[property])
    }
    /// `ActionParameterMissing`.
    pub(crate) fn parameter_missing(action: &str, parameter: &str) -> Self {
        Self::new("ActionParameterMissing", &[action, parameter])
    }
    /// `ActionParameterUnknown`.
    pub(crate) fn parameter_unknown(action: &str, parameter: &str) -> Self {
        Self::new("ActionParameterUnknown", &[action, parameter])
    }
    /// `ActionParameterValueNotInList`.
    pub(crate) fn parameter_value_not_in_list(value: &str, parameter: &str, action: &str) -> Self {
        Self::new("ActionParameterValueNotInList", &[value, parameter, action])
    }
    /// `ActionParameterValueTypeError`.
    pub(crate) fn parameter_type(value: &str, parameter: &str, action: &str) -> Self {
        Self::new("ActionParameterValueTypeError", &[value, parameter, action])
    }
    /// `ActionParameterValueError`.
    pub(crate) fn parameter_value(parameter: &str, action: &str) -> Self {
        Self::new("ActionParameterValueError", &[parameter, action])
    }
    /// `CouldNotEstablishConnection`.
    pub(crate) fn could_not_connect(uri: &str) -> Self {
        Self::new("CouldNotEstablishConnection", &[uri])
    }
    /// `ResourceAtUriInUnknownFormat`.
    pub(crate) fn unknown_format(uri: &str) -> Self {
        Self::new("ResourceAtUriInUnknownFormat", &[uri])
    }
    /// `GeneralError`, with the reason as its resolution.
    pub(crate) fn general(reason: &str) -> Self {
        Self::new("GeneralError", &[reason])
    }

    /// The registry's text, severity and resolution for this message.
    fn registry(&self) -> (&'static str, &'static str, &'static str) {
        match self.key {
            "ResourceMissingAtURI" => (
                "The resource at the URI '%1' was not found.",
                "Critical",
                "Place a valid resource at the URI or correct the URI and resubmit the request.",
            ),
            "OperationNotAllowed" => (
                "The HTTP method is not allowed on this resource.",
                "Critical",
                "None.",
            ),
            "NoValidSession" => (
                "There is no valid session established with the implementation.",
                "Critical",
                "Establish a session before attempting any operations.",
            ),
            "MalformedJSON" => (
                "The request body submitted was malformed JSON and could not be parsed by the receiving service.",
                "Critical",
                "Ensure that the request body is valid JSON and resubmit the request.",
            ),
            "PayloadTooLarge" => (
                "The supplied payload exceeds the maximum size supported by the service.",
                "Critical",
                "Check that the supplied payload is correct and supported by this service.",
            ),
            "HeaderInvalid" => (
                "Header '%1' is invalid.",
                "Critical",
                "Resubmit the request with a valid request header.",
            ),
            "QueryParameterUnsupported" => (
                "Query parameter '%1' is not supported.",
                "Warning",
                "Correct or remove the query parameter and resubmit the request.",
            ),
            "PreconditionFailed" => (
                "The ETag supplied did not match the ETag required to change this resource.",
                "Critical",
                "Try the operation again using the appropriate ETag.",
            ),
            "NoOperation" => (
                "The request body submitted contain no data to act upon and no changes to the resource took place.",
                "Warning",
                "Add properties in the JSON object and resubmit the request.",
            ),
            _ => self.registry_properties(),
        }
    }

    fn registry_properties(&self) -> (&'static str, &'static str, &'static str) {
        const FIX_PROPERTY: &str = "Correct the value for the property in the request body and resubmit the request if the operation failed.";
        const FIX_PARAMETER: &str = "Correct the value for the parameter in the request body and resubmit the request if the operation failed.";
        const CHOOSE: &str = "Choose a value from the enumeration list that the implementation can support and resubmit the request if the operation failed.";
        match self.key {
            "PropertyUnknown" => (
                "The property %1 is not in the list of valid properties for the resource.",
                "Warning",
                "Remove the unknown property from the request body and resubmit the request if the operation failed.",
            ),
            "PropertyNotWritable" => (
                "The property %1 is a read-only property and cannot be assigned a value.",
                "Warning",
                "Remove the property from the request body and resubmit the request if the operation failed.",
            ),
            "PropertyValueNotInList" => (
                "The value '%1' for the property %2 is not in the list of acceptable values.",
                "Warning",
                CHOOSE,
            ),
            "PropertyValueTypeError" => (
                "The value '%1' for the property %2 is not a type that the property can accept.",
                "Warning",
                FIX_PROPERTY,
            ),
            "PropertyValueFormatError" => (
                "The value '%1' for the property %2 is not a format that the property can accept.",
                "Warning",
                FIX_PROPERTY,
            ),
            "PropertyMissing" => (
                "The property %1 is a required property and must be included in the request.",
                "Warning",
                "Ensure that the property is in the request body and has a valid value and resubmit the request if the operation failed.",
            ),
            "ActionParameterMissing" => (
                "The action %1 requires the parameter %2 to be present in the request body.",
                "Critical",
                "Supply the action with the required parameter in the request body when the request is resubmitted.",
            ),
            "ActionParameterUnknown" => (
                "The action %1 was submitted with the invalid parameter %2.",
                "Warning",
                "Correct the invalid action parameter and resubmit the request if the operation failed.",
            ),
            "ActionParameterValueNotInList" => (
                "The value '%1' for the parameter %2 in the action %3 is not in the list of acceptable values.",
                "Warning",
                CHOOSE,
            ),
            "ActionParameterValueTypeError" => (
                "The value '%1' for the parameter %2 in the action %3 is not a type that the parameter can accept.",
                "Warning",
                FIX_PARAMETER,
            ),
            "ActionParameterValueError" => (
                "The value for the parameter %1 in the action %2 is invalid.",
                "Warning",
                FIX_PARAMETER,
            ),
            _ => self.registry_media(),
        }
    }

    fn registry_media(&self) -> (&'static str, &'static str, &'static str) {
        match self.key {
            "InsufficientPrivilege" => (
                "There are insufficient privileges for the account or credentials associated with the current session to perform the requested operation.",
                "Critical",
                "Either abandon the operation or change the associated access rights and resubmit the request if the operation failed.",
            ),
            "CreateFailedMissingReqProperties" => (
                "The create operation failed because the required property %1 was missing from the request.",
                "Critical",
                "Correct the body to include the required property with a valid value and resubmit the request if the operation failed.",
            ),
            "ResourceAlreadyExists" => (
                "The requested resource of type %1 with the property %2 with the value '%3' already exists.",
                "Critical",
                "Do not repeat the create operation as the resource was already created.",
            ),
            "CreateLimitReachedForResource" => (
                "The create operation failed because the resource has reached the limit of possible resources.",
                "Critical",
                "Either delete resources and resubmit the request if the operation failed or do not resubmit the request.",
            ),
            "ResourceCannotBeDeleted" => (
                "The delete request failed because the resource requested cannot be deleted.",
                "Critical",
                "Do not attempt to delete a non-deletable resource.",
            ),
            "CouldNotEstablishConnection" => (
                "The service failed to establish a connection with the URI '%1'.",
                "Critical",
                "Ensure that the URI contains a valid and reachable node name, protocol information, and other URI components.",
            ),
            "ResourceAtUriInUnknownFormat" => (
                "The resource at '%1' is in a format not recognized by the service.",
                "Critical",
                "Place an image or resource or file that is recognized by the service at the URI.",
            ),
            _ => (
                "A general error has occurred.  See Resolution for information on how to resolve the error, or @Message.ExtendedInfo if Resolution is not provided.",
                "Critical",
                "%1",
            ),
        }
    }

    /// The message as `@Message.ExtendedInfo` lists it.
    pub(crate) fn to_json(&self) -> Value {
        let (text, severity, resolution) = self.registry();
        let fill = |template: &str| {
            let mut out = template.to_owned();
            for (i, arg) in self.args.iter().enumerate().rev() {
                out = out.replace(&format!("%{}", i + 1), arg);
            }
            out
        };
        let general = self.key == "GeneralError";
        let args: Vec<&String> = if general {
            Vec::new()
        } else {
            self.args.iter().collect()
        };
        let mut entry = json!({
            "@odata.type": "#Message.v1_2_0.Message",
            "MessageId": format!("{REGISTRY}.{}", self.key),
            "Message": fill(text),
            "MessageArgs": args,
            "MessageSeverity": severity,
            "Resolution": fill(resolution),
        });
        if let Some(pointer) = &self.related {
            entry["RelatedProperties"] = json!([pointer]);
        }
        entry
    }
}

/// An error response: `status`, and the messages that say why (the first one's id and text are
/// the error's `code` and `message`).
pub(crate) fn error(status: StatusCode, messages: &[Message]) -> Response {
    let infos: Vec<Value> = messages.iter().map(Message::to_json).collect();
    let (code, message) = match infos.first() {
        Some(first) if infos.len() == 1 => (
            first["MessageId"].as_str().unwrap_or_default().to_owned(),
            first["Message"].as_str().unwrap_or_default().to_owned(),
        ),
        _ => (
            format!("{REGISTRY}.GeneralError"),
            "A general error has occurred. See ExtendedInfo for more information.".to_owned(),
        ),
    };
    let body = json!({
        "error": {
            "code": code,
            "message": message,
            "@Message.ExtendedInfo": infos,
        }
    });
    let mut response = super::http::json_response(status, &body);
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_fill_the_registry_text() {
        let message = Message::parameter_value_not_in_list("Nmi", "ResetType", "Reset").to_json();
        assert_eq!(
            message["MessageId"],
            "Base.1.22.ActionParameterValueNotInList"
        );
        assert_eq!(
            message["Message"],
            "The value 'Nmi' for the parameter ResetType in the action Reset is not in the list of acceptable values."
        );
        assert_eq!(message["MessageArgs"], json!(["Nmi", "ResetType", "Reset"]));
    }

    #[test]
    fn a_general_error_carries_its_reason_as_resolution() {
        let message = Message::general("the media is not an ISO").to_json();
        assert_eq!(message["Resolution"], "the media is not an ISO");
        assert_eq!(message["MessageArgs"], json!([]));
    }
}
