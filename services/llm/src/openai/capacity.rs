//! What the client knows of the server's capacity, and how a request is fitted
//! to it: the context window (configured, or read once from the server: the
//! OpenAI-compatible `/models` entry's `meta.n_ctx`, or llama.cpp's
//! `/props`), the prompt size in tokens (estimated from the request body's
//! characters at the ratio measured on earlier replies), and the speed
//! (prompt and completion tokens per second, from the server's `timings` or
//! the reply's usage over its duration).
//!
//! A request whose prompt and completion budget do not fit the context gets
//! its longest messages clipped and its completion budget lowered; once the
//! speed is known its completion budget also fits the time limit, and the
//! attempt's timeout follows the speed, never past the configured limit.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use crate::chat::{ChatRequest, Role};

/// Body characters per prompt token assumed before any reply measured it
/// (JSON-escaped English and code run at 3.5 to 4.5).
const CHARS_PER_TOKEN_DEFAULT: f64 = 3.0;
/// Completion tokens kept when the context is tight.
const COMPLETION_MIN: u32 = 64;
/// Completion tokens the time limit never takes a request below: a budget
/// a reply cannot fit in cuts every reply off, which is worse than a reply
/// that runs into the timeout.
const COMPLETION_TIME_MIN: u32 = 256;
/// Characters a clipped message keeps at least.
const CLIPPED_KEEP_MIN: usize = 400;
/// What a clipped message ends with.
const CLIPPED_MARK: &str = "\n…[clipped to fit the model's context]";
/// Share of the time limit a reply is budgeted to take.
const TIME_SHARE: f64 = 0.75;
/// Lowest per-attempt timeout chosen from the measured speed.
const TIMEOUT_MIN: Duration = Duration::from_secs(15);
/// Margin over the expected duration (a queue at the server, a slow start).
const TIMEOUT_FACTOR: f64 = 3.0;
/// Weight of the newest measurement in the running estimate.
const SMOOTHING: f64 = 0.5;

/// Tokens per second as the server measured them (llama.cpp's `timings`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Timings {
    pub prompt_per_second: Option<f64>,
    pub completion_per_second: Option<f64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Measured {
    chars_per_token: Option<f64>,
    prompt_per_second: Option<f64>,
    completion_per_second: Option<f64>,
}

/// The fitted limits of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fitted {
    /// Per-attempt timeout.
    pub timeout: Duration,
    /// Messages clipped to fit the context.
    pub clipped: usize,
}

/// The capacity a client learned; shared by its clones.
#[derive(Debug, Default)]
pub(super) struct Capacity {
    context: tokio::sync::OnceCell<Option<u32>>,
    measured: Mutex<Measured>,
}

impl Capacity {
    /// The context window once known (`None`: not learned, or the server does not say).
    pub(super) fn known_context(&self) -> Option<u32> {
        self.context.get().copied().flatten()
    }

    /// Learns the context window with `discover` unless it was learned; a
    /// discovery that could not reach the server is tried again next time.
    pub(super) async fn context<F>(&self, discover: F) -> Option<u32>
    where
        F: std::future::Future<Output = Result<Option<u32>, ()>>,
    {
        self.context
            .get_or_try_init(|| discover)
            .await
            .ok()
            .copied()
            .flatten()
    }

    fn measured(&self) -> Measured {
        *self
            .measured
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Fits `request` (its messages and completion budget) to `context` and
    /// the time limit `upper`; `body_chars` measures a request as sent.
    pub(super) fn fit(
        &self,
        request: &mut ChatRequest,
        context: Option<u32>,
        upper: Duration,
        body_chars: impl Fn(&ChatRequest) -> usize,
    ) -> Fitted {
        let measured = self.measured();
        let per_token = measured.chars_per_token.unwrap_or(CHARS_PER_TOKEN_DEFAULT);
        let tokens = |request: &ChatRequest| (body_chars(request) as f64 / per_token).ceil() as u32;
        let mut clipped = 0;
        if let Some(context) = context {
            let reserve = request.max_tokens.min((context / 4).max(COMPLETION_MIN));
            let limit = context.saturating_sub(reserve);
            let mut prompt = tokens(request);
            while prompt > limit {
                let over_chars = ((prompt - limit) as f64 * per_token).ceil() as usize;
                if !clip_longest(request, over_chars + CLIPPED_MARK.len()) {
                    break;
                }
                clipped += 1;
                prompt = tokens(request);
            }
            let room = context
                .saturating_sub(prompt)
                .max(COMPLETION_MIN.min(context));
            request.max_tokens = request.max_tokens.min(room);
        }
        let prompt_seconds = measured
            .prompt_per_second
            .map_or(0.0, |speed| f64::from(tokens(request)) / speed);
        let Some(speed) = measured.completion_per_second else {
            return Fitted {
                timeout: upper,
                clipped,
            };
        };
        let budget_seconds = (upper.as_secs_f64() * TIME_SHARE - prompt_seconds).max(0.0);
        let in_time = (budget_seconds * speed).floor() as u32;
        request.max_tokens = request.max_tokens.min(in_time.max(COMPLETION_TIME_MIN));
        let expected = prompt_seconds + f64::from(request.max_tokens) / speed;
        let timeout = Duration::from_secs_f64(expected * TIMEOUT_FACTOR)
            .max(TIMEOUT_MIN)
            .min(upper);
        Fitted { timeout, clipped }
    }

    /// Takes in what a reply showed: `body_chars` sent for `prompt_tokens`,
    /// and the speed (the server's `timings`, else the completion over the
    /// whole `elapsed`).
    pub(super) fn observe(
        &self,
        body_chars: usize,
        prompt_tokens: u32,
        completion_tokens: u32,
        timings: Option<Timings>,
        elapsed: Duration,
    ) {
        let mut measured = self
            .measured
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if prompt_tokens > 0 {
            let ratio = body_chars as f64 / f64::from(prompt_tokens);
            measured.chars_per_token = Some(smooth(measured.chars_per_token, ratio));
        }
        let reported = timings.unwrap_or(Timings {
            prompt_per_second: None,
            completion_per_second: None,
        });
        if let Some(speed) = reported
            .prompt_per_second
            .filter(|s| s.is_finite() && *s > 0.0)
        {
            measured.prompt_per_second = Some(smooth(measured.prompt_per_second, speed));
        }
        let completion = reported
            .completion_per_second
            .or_else(|| {
                (completion_tokens > 0 && !elapsed.is_zero())
                    .then(|| f64::from(completion_tokens) / elapsed.as_secs_f64())
            })
            .filter(|s| s.is_finite() && *s > 0.0);
        if let Some(speed) = completion {
            measured.completion_per_second = Some(smooth(measured.completion_per_second, speed));
        }
    }
}

fn smooth(previous: Option<f64>, latest: f64) -> f64 {
    previous.map_or(latest, |previous| {
        previous * (1.0 - SMOOTHING) + latest * SMOOTHING
    })
}

/// Clips the longest message (the system prompt and the last message last)
/// by about `chars`; false when nothing is left to clip.
fn clip_longest(request: &mut ChatRequest, chars: usize) -> bool {
    let last = request.messages.len().saturating_sub(1);
    let candidate = |spare_protected: bool| {
        request
            .messages
            .iter()
            .enumerate()
            .filter(|(index, message)| {
                spare_protected || (message.role != Role::System && *index != last)
            })
            .filter_map(|(index, message)| {
                let length = message.content.as_deref().map_or(0, |c| c.chars().count());
                (length > CLIPPED_KEEP_MIN).then_some((index, length))
            })
            .max_by_key(|(_, length)| *length)
    };
    let Some((index, length)) = candidate(false).or_else(|| candidate(true)) else {
        return false;
    };
    let keep = length.saturating_sub(chars).max(CLIPPED_KEEP_MIN);
    if let Some(content) = request.messages[index].content.as_mut() {
        let cut = content
            .char_indices()
            .nth(keep)
            .map_or(content.len(), |(cut, _)| cut);
        content.truncate(cut);
        content.push_str(CLIPPED_MARK);
    }
    true
}

/// The context window a server reports: an OpenAI-compatible `/models`
/// listing's entry for `model` (or its only entry) with `meta.n_ctx`, or
/// llama.cpp's `/props` with `default_generation_settings.n_ctx`.
pub(super) fn context_of(
    models: Option<&Value>,
    props: Option<&Value>,
    model: &str,
) -> Option<u32> {
    let from_models = models
        .and_then(|listing| listing.get("data"))
        .and_then(Value::as_array)
        .and_then(|entries| {
            entries
                .iter()
                .find(|entry| entry.get("id").and_then(Value::as_str) == Some(model))
                .or_else(|| (entries.len() == 1).then(|| &entries[0]))
        })
        .and_then(|entry| entry.pointer("/meta/n_ctx"))
        .and_then(Value::as_u64);
    let from_props = || {
        props
            .and_then(|props| props.pointer("/default_generation_settings/n_ctx"))
            .and_then(Value::as_u64)
    };
    from_models
        .or_else(from_props)
        .and_then(|tokens| u32::try_from(tokens).ok())
        .filter(|tokens| *tokens > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ChatMessage;
    use serde_json::json;

    fn chars(request: &ChatRequest) -> usize {
        request
            .messages
            .iter()
            .map(|message| message.content.as_deref().map_or(0, str::len))
            .sum()
    }

    #[test]
    fn a_prompt_too_large_for_the_context_is_clipped_and_the_budget_lowered() {
        let capacity = Capacity::default();
        let mut request = ChatRequest::new(vec![
            ChatMessage::system("s".repeat(600)),
            ChatMessage::user("tool output ".repeat(2000)),
            ChatMessage::user("the question"),
        ]);
        request.max_tokens = 4096;
        let fitted = capacity.fit(&mut request, Some(2048), Duration::from_secs(60), chars);
        assert!(fitted.clipped >= 1);
        assert_eq!(
            fitted.timeout,
            Duration::from_secs(60),
            "no speed known yet"
        );
        let prompt = chars(&request) as f64 / CHARS_PER_TOKEN_DEFAULT;
        assert!(
            prompt + f64::from(request.max_tokens) <= 2048.0,
            "{prompt} + {}",
            request.max_tokens
        );
        assert!(request.max_tokens >= 256);
        assert_eq!(
            request.messages[0].content.as_deref().map(str::len),
            Some(600)
        );
        assert_eq!(request.messages[2].content.as_deref(), Some("the question"));
        assert!(
            request.messages[1]
                .content
                .as_deref()
                .unwrap_or_default()
                .ends_with(CLIPPED_MARK)
        );
    }

    #[test]
    fn the_budget_and_the_timeout_follow_the_measured_speed_under_the_limit() {
        let capacity = Capacity::default();
        capacity.observe(
            3000,
            1000,
            100,
            Some(Timings {
                prompt_per_second: Some(500.0),
                completion_per_second: Some(20.0),
            }),
            Duration::from_secs(7),
        );
        let mut request = ChatRequest::new(vec![ChatMessage::user("x".repeat(3000))]);
        request.max_tokens = 4096;
        let fitted = capacity.fit(&mut request, None, Duration::from_secs(60), chars);
        // 45 s of the 60 at 20 tokens/s, less the 2 s the prompt takes.
        assert_eq!(request.max_tokens, 860);
        assert_eq!(fitted.timeout, Duration::from_secs(60));
        let mut small = ChatRequest::new(vec![ChatMessage::user("x".repeat(300))]);
        small.max_tokens = 100;
        let fitted = capacity.fit(&mut small, None, Duration::from_secs(60), chars);
        assert_eq!(small.max_tokens, 100);
        // 3 × (0.2 s of prompt + 5 s of completion), above the floor.
        assert_eq!(fitted.timeout.as_millis(), 15_600);
    }

    #[test]
    fn the_context_is_read_from_models_or_props() {
        let models = json!({"data": [{"id": "smollm2", "meta": {"n_ctx": 8192}}]});
        assert_eq!(context_of(Some(&models), None, "other"), Some(8192));
        let openai = json!({"data": [{"id": "a"}, {"id": "b"}]});
        let props = json!({"default_generation_settings": {"n_ctx": 4096}});
        assert_eq!(context_of(Some(&openai), Some(&props), "a"), Some(4096));
        assert_eq!(context_of(Some(&openai), None, "a"), None);
    }
}
