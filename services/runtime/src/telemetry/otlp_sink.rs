//! An OTLP/HTTP trace receiver on a loopback port: it decodes each
//! `ExportTraceServiceRequest` (protobuf) and either keeps the spans
//! (tests look for one trace across services) or only counts them (the
//! acknowledgement benchmark measures the cost of exporting).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message as _;
use tokio_util::sync::CancellationToken;

/// Most spans a keeping sink holds; later ones are only counted.
const KEPT_SPANS_MAX: usize = 100_000;

/// What the sink does with the spans it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    Keep,
    CountOnly,
}

/// One received span, flattened.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The `service.name` of the resource that sent it.
    pub service_name: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub attributes: Vec<(String, AttributeValue)>,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&AttributeValue> {
        self.attributes
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value)
    }
}

/// An attribute's value as received.
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeValue {
    Text(String),
    Integer(i64),
    Float(f64),
    Bool(bool),
    List(Vec<AttributeValue>),
    Other,
}

#[derive(Debug, Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    count: u64,
    requests: u64,
}

/// The running receiver; stops when dropped.
#[derive(Debug)]
pub struct OtlpSink {
    address: SocketAddr,
    received: Arc<Mutex<Received>>,
    stop: CancellationToken,
}

impl OtlpSink {
    /// Listens on `127.0.0.1` on a free port.
    pub async fn start(retention: Retention) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let received = Arc::new(Mutex::new(Received::default()));
        let stop = CancellationToken::new();
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(export))
            .with_state((received.clone(), retention));
        let stopped = stop.clone();
        // Ends with the token (dropping the sink), so it is never left behind.
        tokio::spawn(async move {
            let serve = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await });
            if let Err(error) = serve.await {
                tracing::warn!(%error, "the OTLP sink stopped");
            }
        });
        Ok(Self {
            address,
            received,
            stop,
        })
    }

    /// The base URL for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    /// The spans kept so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.lock().spans.clone()
    }

    /// Spans received so far (kept or not).
    pub fn span_count(&self) -> u64 {
        self.lock().count
    }

    /// Export requests received so far.
    pub fn request_count(&self) -> u64 {
        self.lock().requests
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Received> {
        self.received
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn export(
    State((received, retention)): State<(Arc<Mutex<Received>>, Retention)>,
    body: Bytes,
) -> axum::response::Response {
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(request) => request,
        Err(error) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("not an ExportTraceServiceRequest: {error}"),
            )
                .into_response();
        }
    };
    let mut received = received
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    received.requests += 1;
    for resource_spans in request.resource_spans {
        let service_name = resource_spans
            .resource
            .as_ref()
            .and_then(|resource| {
                resource
                    .attributes
                    .iter()
                    .find(|attribute| attribute.key == "service.name")
            })
            .map(|attribute| match value_of(attribute.value.as_ref()) {
                AttributeValue::Text(name) => name,
                _ => String::new(),
            })
            .unwrap_or_default();
        for span in resource_spans
            .scope_spans
            .into_iter()
            .flat_map(|scope| scope.spans)
        {
            received.count += 1;
            if retention == Retention::Keep && received.spans.len() < KEPT_SPANS_MAX {
                received.spans.push(ReceivedSpan {
                    service_name: service_name.clone(),
                    name: span.name,
                    trace_id: hex::encode(span.trace_id),
                    span_id: hex::encode(span.span_id),
                    parent_span_id: hex::encode(span.parent_span_id),
                    attributes: span.attributes.iter().map(attribute).collect(),
                });
            }
        }
    }
    (
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
        .into_response()
}

fn attribute(pair: &KeyValue) -> (String, AttributeValue) {
    (pair.key.clone(), value_of(pair.value.as_ref()))
}

fn value_of(value: Option<&AnyValue>) -> AttributeValue {
    match value.and_then(|value| value.value.as_ref()) {
        Some(any_value::Value::StringValue(text)) => AttributeValue::Text(text.clone()),
        Some(any_value::Value::IntValue(number)) => AttributeValue::Integer(*number),
        Some(any_value::Value::DoubleValue(number)) => AttributeValue::Float(*number),
        Some(any_value::Value::BoolValue(flag)) => AttributeValue::Bool(*flag),
        Some(any_value::Value::ArrayValue(list)) => AttributeValue::List(
            list.values
                .iter()
                .map(|item| value_of(Some(item)))
                .collect(),
        ),
        _ => AttributeValue::Other,
    }
}
