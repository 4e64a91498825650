//! The event contract as an AsyncAPI 3 document, generated from the
//! catalogue ([`crate::catalogue::ALL`]), the protobuf descriptors of
//! `proto/`, the header codec ([`crate::codec`]) and the reaction consumers
//! the services declare (handed in by the caller, since this crate knows no
//! service).
//!
//! One channel per event type (`zopu.evt.{orgid}.{projectid}.<type>`), one
//! message per type with its protobuf message (the payload shown as its
//! proto3 JSON mapping, the wire body being the binary encoding), every
//! `ce-*` header with its meaning, and one `receive` operation per consumer
//! and event type it takes. The generated document is checked in at
//! `proto/asyncapi.json` ([`CHECKED_IN`]); [`differences`] names what a
//! regeneration would change, so a test fails when the catalogue moved on
//! without it. Pure: no I/O.

use std::collections::BTreeMap;

use prost_reflect::{Cardinality, EnumDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value, json};

use crate::catalogue::EventKind;
use crate::{codec, subjects};

/// The document as checked in (`proto/asyncapi.json`), served by the gateway.
pub const CHECKED_IN: &str = include_str!("../../../proto/asyncapi.json");

/// Where the checked-in document lives, relative to the workspace root.
pub const CHECKED_IN_PATH: &str = "proto/asyncapi.json";

/// A durable consumer a service runs (a reaction), as the document shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    pub service: String,
    pub durable: String,
    pub filter_subjects: Vec<String>,
    pub max_deliver: i64,
    pub max_ack_pending: i64,
}

/// One header every event carries or may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub name: &'static str,
    pub required: bool,
    pub meaning: &'static str,
}

/// `Nats-Msg-Id`: written by the publisher beside the CloudEvents headers.
pub const NATS_MESSAGE_ID: &str = "Nats-Msg-Id";

/// Every header of an event on the stream, with its meaning.
pub const HEADERS: &[Header] = &[
    Header {
        name: codec::SPECVERSION,
        required: true,
        meaning: "CloudEvents specversion, always 1.0.",
    },
    Header {
        name: codec::ID,
        required: true,
        meaning: "The event id (UUIDv7), derived from the causing event and the idempotency key, so a re-run handler writes the same id.",
    },
    Header {
        name: codec::SOURCE,
        required: true,
        meaning: "The writer: zopu/<service> (gateway, setup, dispatch, conversation, specialists, artifacts, cli).",
    },
    Header {
        name: codec::TYPE,
        required: true,
        meaning: "The dotted event type; equals the last tokens of the subject.",
    },
    Header {
        name: codec::SUBJECT,
        required: true,
        meaning: "The project id (CloudEvents subject); equals ce-projectid.",
    },
    Header {
        name: codec::TIME,
        required: true,
        meaning: "When the event was written (RFC 3339, UTC).",
    },
    Header {
        name: codec::CONTENT_TYPE,
        required: true,
        meaning: "CloudEvents datacontenttype: application/protobuf (the body is the binary protobuf message).",
    },
    Header {
        name: codec::DATASCHEMA,
        required: true,
        meaning: "The protobuf message of the body as an absolute URI, urn:zopu:proto:<full message name>, e.g. urn:zopu:proto:zopu.v1.ProjectReady; a new version is a new message. Events recorded before it became a URI carry the bare name (zopu.v1.ProjectReady); both name the same message.",
    },
    Header {
        name: codec::CORRELATION_ID,
        required: true,
        meaning: "The id shared by every event of one causal chain (the root event's id).",
    },
    Header {
        name: codec::CAUSATION_ID,
        required: true,
        meaning: "The id of the event that directly caused this one (a root event's own id).",
    },
    Header {
        name: codec::ORG_ID,
        required: true,
        meaning: "The organization; equals the subject's {orgid} token (readers refuse a mismatch).",
    },
    Header {
        name: codec::PROJECT_ID,
        required: true,
        meaning: "The project; equals the subject's {projectid} token (readers refuse a mismatch).",
    },
    Header {
        name: codec::IDEMPOTENCY_KEY,
        required: true,
        meaning: "The deterministic key derived from what caused the event (also sent as Nats-Msg-Id).",
    },
    Header {
        name: codec::PROJECT_VERSION,
        required: true,
        meaning: "The event's position in its project's history: 1, 2, 3, ... without gaps.",
    },
    Header {
        name: codec::PREVIOUS_HASH,
        required: false,
        meaning: "SHA-256 (hex) of the project's previous event; absent on a project's first event. zopu audit verify checks the chain.",
    },
    Header {
        name: codec::WORK_ID,
        required: false,
        meaning: "The work item the event belongs to, where one applies.",
    },
    Header {
        name: codec::THREAD_ID,
        required: false,
        meaning: "The thread the event belongs to, where one applies.",
    },
    Header {
        name: codec::FLOW_RUN_ID,
        required: false,
        meaning: "The specialist flow run the event belongs to, where one applies.",
    },
    Header {
        name: codec::DISPATCH_ID,
        required: false,
        meaning: "The dispatch (one agent turn for one source event) the event belongs to, where one applies.",
    },
    Header {
        name: codec::TRACEPARENT,
        required: false,
        meaning: "W3C trace context of the chain, continued by every service that reacts.",
    },
    Header {
        name: NATS_MESSAGE_ID,
        required: true,
        meaning: "JetStream deduplication id: the idempotency key, so a repeated append inside the duplicate window is dropped.",
    },
];

/// The document for `catalogue` and `consumers`.
pub fn document(catalogue: &[EventKind], consumers: &[Consumer]) -> Value {
    let mut schemas = BTreeMap::new();
    let mut channels = Map::new();
    let mut messages = Map::new();
    for kind in catalogue {
        let key = kind.event_type;
        let message = message_of(kind, &mut schemas);
        messages.insert(key.to_owned(), message);
        channels.insert(
            key.to_owned(),
            json!({
                "address": subjects::event_address_template(key),
                "title": key,
                "description": format!("Every `{key}` event of one project, in the project's order."),
                "parameters": {
                    "orgid": { "$ref": "#/components/parameters/orgid" },
                    "projectid": { "$ref": "#/components/parameters/projectid" },
                },
                "messages": { key: { "$ref": format!("#/components/messages/{key}") } },
            }),
        );
    }
    let mut operations = Map::new();
    for consumer in consumers {
        for kind in catalogue {
            let key = kind.event_type;
            let Some(filter) = consumer
                .filter_subjects
                .iter()
                .find(|filter| subjects::filter_takes_type(filter, key))
            else {
                continue;
            };
            operations.insert(
                format!("{}.{key}", consumer.durable),
                json!({
                    "action": "receive",
                    "channel": { "$ref": format!("#/channels/{key}") },
                    "messages": [{ "$ref": format!("#/channels/{key}/messages/{key}") }],
                    "title": format!("{} takes {key}", consumer.service),
                    "summary": format!(
                        "The {} service's durable pull consumer {} (filter {filter}; explicit ack, at most {} deliveries, at most {} unacknowledged).",
                        consumer.service, consumer.durable, consumer.max_deliver, consumer.max_ack_pending
                    ),
                    "tags": [{ "name": consumer.service }],
                    "x-zopu-service": consumer.service,
                    "x-zopu-durable": consumer.durable,
                    "x-zopu-filter-subjects": consumer.filter_subjects,
                }),
            );
        }
    }
    schemas.insert("ZopuHeaders".to_owned(), headers_schema());
    json!({
        "asyncapi": "3.1.0",
        "info": {
            "title": "Zopu event contract",
            "version": env!("CARGO_PKG_VERSION"),
            "description": DESCRIPTION,
        },
        "defaultContentType": crate::envelope::CONTENT_TYPE,
        "servers": {
            "local": {
                "host": "127.0.0.1:4222",
                "protocol": "nats",
                "description": format!("A local nats-server; events are stored in the JetStream stream {}.", subjects::EVENTS_STREAM),
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {
            "messages": messages,
            "schemas": schemas,
            "parameters": {
                "orgid": { "description": "The organization id (a subject-safe token)." },
                "projectid": { "description": "The project id (a UUID)." },
            },
        },
    })
}

const DESCRIPTION: &str = "Every fact of the Zopu runtime is an immutable CloudEvent in the JetStream stream ZOPU_EVENTS, \
in CloudEvents binary content mode: each attribute in its own percent-encoded ce-* header, the protobuf message as the body. \
Integrators filter with wildcards (zopu.evt.*.*.artifact.>, zopu.evt.<orgid>.>). Payloads are shown as the proto3 JSON mapping \
of their message (proto/zopu/v1); the wire body is the binary encoding of the message ce-dataschema names (urn:zopu:proto:zopu.v1.ProjectReady; \
events recorded before it became a URI carry the bare zopu.v1.ProjectReady). The operations are the durable \
consumers the services run (their reactions, partitioned as <durable>-p<n>of<N> when scaled out); every service, the gateway \
included, also keeps its projections from an ordered, ephemeral consumer of zopu.evt.>. Generated by `zopu contract asyncapi`.";

/// The document as the checked-in file spells it (pretty, newline at the end).
pub fn render(document: &Value) -> String {
    // Serializing a Value cannot fail (its keys are strings).
    let mut text = serde_json::to_string_pretty(document).unwrap_or_default();
    text.push('\n');
    text
}

/// Where `current` (freshly generated) differs from `checked_in`: JSON
/// pointers of what was added, removed or changed, at most `limit`.
pub fn differences(checked_in: &Value, current: &Value, limit: usize) -> Vec<String> {
    let mut found = Vec::new();
    diff("", checked_in, current, &mut found, limit);
    found
}

fn diff(path: &str, old: &Value, new: &Value, found: &mut Vec<String>, limit: usize) {
    if found.len() >= limit {
        return;
    }
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            for (key, value) in new {
                let here = format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"));
                match old.get(key) {
                    Some(before) => diff(&here, before, value, found, limit),
                    None if found.len() < limit => found.push(format!("added {here}")),
                    None => return,
                }
            }
            for key in old.keys().filter(|key| !new.contains_key(*key)) {
                if found.len() < limit {
                    found.push(format!("removed {path}/{key}"));
                }
            }
        }
        (old, new) if old != new => found.push(format!("changed {}", display(path))),
        _ => {}
    }
}

fn display(path: &str) -> &str {
    if path.is_empty() { "/" } else { path }
}

fn message_of(kind: &EventKind, schemas: &mut BTreeMap<String, Value>) -> Value {
    let descriptor = crate::catalogue::pool().get_message_by_name(kind.schema);
    let (payload, summary, file) = match &descriptor {
        Some(message) => {
            add_message_schema(message, schemas);
            (
                json!({ "$ref": format!("#/components/schemas/{}", message.full_name()) }),
                comment_of(message),
                message.parent_file().name().to_owned(),
            )
        }
        None => (
            json!({ "description": format!("{} is not in proto/", kind.schema) }),
            String::new(),
            String::new(),
        ),
    };
    let name = kind.schema.rsplit('.').next().unwrap_or(kind.schema);
    let mut message = json!({
        "name": name,
        "title": kind.event_type,
        "contentType": crate::envelope::CONTENT_TYPE,
        "headers": {
            "allOf": [
                { "$ref": "#/components/schemas/ZopuHeaders" },
                {
                    "type": "object",
                    "properties": {
                        codec::TYPE: { "const": kind.event_type },
                        codec::DATASCHEMA: { "enum": [codec::dataschema_uri(kind.schema), kind.schema] },
                    },
                },
            ],
        },
        "payload": payload,
        "correlationId": { "location": format!("$message.header#/{}", codec::CORRELATION_ID) },
        "x-zopu-dataschema": codec::dataschema_uri(kind.schema),
        "x-zopu-proto-file": format!("proto/{file}"),
    });
    if !summary.is_empty() {
        message["summary"] = Value::String(summary);
    }
    message
}

/// The leading comment of a message in its `.proto` file, on one line.
fn comment_of(message: &MessageDescriptor) -> String {
    let file = message.parent_file_descriptor_proto();
    file.source_code_info
        .as_ref()
        .and_then(|info| {
            info.location
                .iter()
                .find(|location| location.path == message.path())
        })
        .and_then(|location| location.leading_comments.as_deref())
        .map(|text| text.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn add_message_schema(message: &MessageDescriptor, schemas: &mut BTreeMap<String, Value>) {
    let name = message.full_name().to_owned();
    if schemas.contains_key(&name) {
        return;
    }
    // Placeholder first: recursive messages refer to themselves.
    schemas.insert(name.clone(), Value::Null);
    let mut properties = Map::new();
    for field in message.fields() {
        let mut schema = if field.is_map() {
            let value = match field.kind() {
                Kind::Message(entry) => entry
                    .get_field_by_name("value")
                    .map(|value| kind_schema(&value.kind(), schemas))
                    .unwrap_or_else(|| json!({})),
                _ => json!({}),
            };
            json!({ "type": "object", "additionalProperties": value })
        } else if field.is_list() || field.cardinality() == Cardinality::Repeated {
            json!({ "type": "array", "items": kind_schema(&field.kind(), schemas) })
        } else {
            kind_schema(&field.kind(), schemas)
        };
        if let Value::Object(object) = &mut schema {
            object.insert(
                "x-protobuf-field".to_owned(),
                json!(format!("{} = {}", field.name(), field.number())),
            );
        }
        properties.insert(field.json_name().to_owned(), schema);
    }
    let mut schema = json!({
        "type": "object",
        "title": name,
        "properties": properties,
    });
    let comment = comment_of(message);
    if !comment.is_empty() {
        schema["description"] = Value::String(comment);
    }
    schemas.insert(name, schema);
}

fn enum_schema(descriptor: &EnumDescriptor, schemas: &mut BTreeMap<String, Value>) -> Value {
    let name = descriptor.full_name().to_owned();
    if !schemas.contains_key(&name) {
        let values: Vec<String> = descriptor
            .values()
            .map(|value| value.name().to_owned())
            .collect();
        schemas.insert(
            name.clone(),
            json!({ "type": "string", "title": name, "enum": values }),
        );
    }
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// The proto3 JSON mapping of one field kind.
fn kind_schema(kind: &Kind, schemas: &mut BTreeMap<String, Value>) -> Value {
    match kind {
        Kind::Double | Kind::Float => json!({ "type": "number" }),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            json!({ "type": "integer", "format": "int32" })
        }
        Kind::Uint32 | Kind::Fixed32 => json!({ "type": "integer", "minimum": 0 }),
        // proto3 JSON writes 64-bit integers as decimal strings.
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
            json!({ "type": "string", "format": "int64" })
        }
        Kind::Uint64 | Kind::Fixed64 => json!({ "type": "string", "format": "uint64" }),
        Kind::Bool => json!({ "type": "boolean" }),
        Kind::String => json!({ "type": "string" }),
        Kind::Bytes => json!({ "type": "string", "contentEncoding": "base64" }),
        Kind::Enum(descriptor) => enum_schema(descriptor, schemas),
        Kind::Message(message) if message.full_name() == "google.protobuf.Timestamp" => {
            json!({ "type": "string", "format": "date-time" })
        }
        Kind::Message(message) => {
            add_message_schema(message, schemas);
            json!({ "$ref": format!("#/components/schemas/{}", message.full_name()) })
        }
    }
}

fn headers_schema() -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for header in HEADERS {
        properties.insert(
            header.name.to_owned(),
            json!({ "type": "string", "description": header.meaning }),
        );
        if header.required {
            required.push(header.name);
        }
    }
    json!({
        "type": "object",
        "title": "Zopu event headers",
        "description": "CloudEvents binary content mode on NATS: one header per attribute, values percent-encoded (space, \", % and everything outside printable ASCII).",
        "properties": properties,
        "required": required,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumers() -> Vec<Consumer> {
        vec![Consumer {
            service: "dispatch".into(),
            durable: "dispatch-sources".into(),
            filter_subjects: vec![
                subjects::events_of_type("project.ready"),
                subjects::events_of_type("flow.>"),
            ],
            max_deliver: 5,
            max_ack_pending: 256,
        }]
    }

    #[test]
    fn every_codec_header_has_a_meaning() {
        for known in codec::KNOWN {
            assert!(
                HEADERS.iter().any(|header| header.name == *known),
                "{known} has no meaning in HEADERS"
            );
        }
        assert_eq!(
            HEADERS.len(),
            codec::KNOWN.len() + 1,
            "one meaning per header"
        );
    }

    #[test]
    fn every_event_type_has_a_channel_and_a_message_with_its_protobuf_payload() {
        let document = document(crate::catalogue::ALL, &consumers());
        for kind in crate::catalogue::ALL {
            let channel = &document["channels"][kind.event_type];
            assert_eq!(
                channel["address"],
                format!("zopu.evt.{{orgid}}.{{projectid}}.{}", kind.event_type)
            );
            let message = &document["components"]["messages"][kind.event_type];
            let uri = format!("urn:zopu:proto:{}", kind.schema);
            assert_eq!(message["x-zopu-dataschema"], uri.as_str());
            assert_eq!(
                message["headers"]["allOf"][1]["properties"][codec::DATASCHEMA]["enum"],
                json!([uri, kind.schema]),
                "new events carry the URI, recorded ones the bare name"
            );
            let reference = message["payload"]["$ref"].as_str().unwrap_or_default();
            let schema_name = reference.trim_start_matches("#/components/schemas/");
            assert_eq!(schema_name, kind.schema);
            assert_eq!(
                document["components"]["schemas"][schema_name]["type"],
                "object"
            );
        }
    }

    #[test]
    fn consumers_become_receive_operations_per_type_they_take() {
        let document = document(crate::catalogue::ALL, &consumers());
        let operations = document["operations"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert!(operations.contains_key("dispatch-sources.project.ready"));
        assert!(operations.contains_key("dispatch-sources.flow.completed"));
        assert!(!operations.contains_key("dispatch-sources.project.setup.requested"));
        let operation = &operations["dispatch-sources.flow.completed"];
        assert_eq!(operation["action"], "receive");
        assert_eq!(operation["channel"]["$ref"], "#/channels/flow.completed");
    }

    #[test]
    fn a_new_event_type_is_a_difference() {
        let before = document(crate::catalogue::ALL, &consumers());
        let mut catalogue = crate::catalogue::ALL.to_vec();
        catalogue.push(EventKind {
            event_type: "flow.paused",
            schema: "zopu.v1.FlowProgress",
        });
        let after = document(&catalogue, &consumers());
        let found = differences(&before, &after, 50);
        assert!(
            found.contains(&"added /channels/flow.paused".to_owned()),
            "{found:?}"
        );
        assert!(
            found.contains(&"added /operations/dispatch-sources.flow.paused".to_owned()),
            "{found:?}"
        );
        assert!(
            found.contains(&"added /components/messages/flow.paused".to_owned()),
            "{found:?}"
        );
        assert!(differences(&after, &after, 50).is_empty());
    }

    #[test]
    fn message_comments_come_from_the_proto_files() {
        let document = document(crate::catalogue::ALL, &[]);
        let summary = document["components"]["messages"]["dispatch.completed"]["summary"]
            .as_str()
            .unwrap_or_default();
        assert!(summary.contains("dispatch.completed"), "{summary}");
    }
}
