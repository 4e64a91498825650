//! Layered configuration: defaults → optional TOML file → `ZOPU_*`
//! environment → command-line overrides, validated at start.
//!
//! Environment variables map onto keys by lowercasing and splitting on a
//! double underscore: `ZOPU_NATS_URL` → `nats_url`,
//! `ZOPU_SANDBOX__ALLOW_LOCAL_REPOSITORIES` → `sandbox.allow_local_repositories`.
//! Values are read as TOML literals when they parse as one (`true`, `3`,
//! `"x"`), else as strings. An unknown key is an error that names it and
//! where it came from, so a typo never silently falls back to a default.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// Environment variables with the `ZOPU_` prefix that are not settings.
pub const NON_SETTING_VARIABLES: &[&str] = &[
    "ZOPU_CONFIG",
    "ZOPU_LOG",
    "ZOPU_LLM_API_KEY",
    "ZOPU_GATEWAY_LINK_KEY",
    // The reference external runtime's agent key (`zopu agent run-external`'s `key_env`).
    "ZOPU_AGENT_KEY",
    // The deployment's secret (`zopu_core::secret_store::SECRETS_KEY_VARIABLE`).
    "ZOPU_SECRETS_KEY",
    "ZOPU_NATS_SERVER",
    // The default of the CLI's `--org` flag (read by clap, not a setting).
    "ZOPU_ORG",
    // Read by the test harness (the chaos run, the binary under test, where
    // its nats-server runs).
    "ZOPU_BIN",
    "ZOPU_CHAOS_SEED",
    "ZOPU_CHAOS_SCALE",
    "ZOPU_TEST_NATS",
    "ZOPU_TEST_NATS_IMAGE",
    // Cases per fuzz target of the tests (`make test`, `make fuzz`).
    "ZOPU_FUZZ_CASES",
    // Turns the real-model peer test's skip into a failure (`.ci/run`).
    "ZOPU_REQUIRE_LLAMA_SERVER",
    // Read by deploy/scripts (make images, make test-deploy), which run zopu.
    "ZOPU_KEEP_DEPLOY",
    "ZOPU_REBUILD_BASE",
    "ZOPU_DEBIAN_MIRROR",
    "ZOPU_DOCKERD_LOG",
    "ZOPU_DOCKERD_WAIT",
    "ZOPU_NATS_READY_TIMEOUT",
    crate::nats::USER_VARIABLE,
    crate::nats::PASSWORD_VARIABLE,
    crate::nats::PASSWORD_FILE_VARIABLE,
    crate::nats::CREDENTIALS_FILE_VARIABLE,
    crate::nats::CA_FILE_VARIABLE,
    crate::nats::CERT_FILE_VARIABLE,
    crate::nats::KEY_FILE_VARIABLE,
];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("config file {path} is not valid TOML: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("{origin}: {reason}")]
    Invalid { origin: String, reason: String },
    #[error("setting {key}: {reason}")]
    Setting { key: String, reason: String },
}

impl ConfigError {
    /// A validation failure of one setting, for `validate()` implementations.
    pub fn setting(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Setting {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// Where settings come from, in increasing precedence.
#[derive(Debug, Default, Clone)]
pub struct Sources {
    pub file: Option<PathBuf>,
    /// `(NAME, value)` pairs, normally `std::env::vars()`.
    pub environment: Vec<(String, String)>,
    /// Dotted keys and TOML-literal-or-string values from flags.
    pub overrides: Vec<(String, String)>,
}

impl Sources {
    /// The process environment and the file named by `--config` / `ZOPU_CONFIG`.
    pub fn from_process(file: Option<PathBuf>) -> Self {
        let environment: Vec<(String, String)> = std::env::vars().collect();
        let file = file.or_else(|| {
            environment
                .iter()
                .find(|(name, _)| name == "ZOPU_CONFIG")
                .map(|(_, value)| PathBuf::from(value))
        });
        Self {
            file,
            environment,
            overrides: Vec::new(),
        }
    }

    pub fn set(mut self, key: &str, value: impl ToString) -> Self {
        self.overrides.push((key.to_owned(), value.to_string()));
        self
    }
}

/// Loads `T` (which supplies its defaults through serde) from the sources.
pub fn load<T: DeserializeOwned>(sources: &Sources) -> Result<T, ConfigError> {
    let mut root = toml::Table::new();
    if let Some(path) = &sources.file {
        merge(&mut root, read_file(path)?);
    }
    for (name, value) in &sources.environment {
        let Some(rest) = name.strip_prefix("ZOPU_") else {
            continue;
        };
        if NON_SETTING_VARIABLES.contains(&name.as_str()) || rest.is_empty() {
            continue;
        }
        let key = rest
            .split("__")
            .map(str::to_lowercase)
            .collect::<Vec<_>>()
            .join(".");
        insert(
            &mut root,
            &key,
            literal(value),
            &format!("environment variable {name}"),
        )?;
    }
    for (key, value) in &sources.overrides {
        insert(&mut root, key, literal(value), &format!("flag for {key}"))?;
    }
    let origin = describe_origin(sources);
    serde_path_to_error::deserialize(toml::Value::Table(root)).map_err(|error| {
        let path = error.path().to_string();
        let reason = error.into_inner().message().to_owned();
        if path.is_empty() || path == "." {
            ConfigError::Invalid { origin, reason }
        } else {
            ConfigError::Invalid {
                origin,
                reason: format!("setting {path}: {reason}"),
            }
        }
    })
}

fn describe_origin(sources: &Sources) -> String {
    match &sources.file {
        Some(path) => format!(
            "configuration (file {}, ZOPU_* environment, flags)",
            path.display()
        ),
        None => "configuration (ZOPU_* environment, flags)".to_owned(),
    }
}

fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.to_owned(),
        reason: error.to_string(),
    })?;
    text.parse::<toml::Table>()
        .map_err(|error| ConfigError::Parse {
            path: path.to_owned(),
            reason: error.message().to_owned(),
        })
}

fn literal(raw: &str) -> toml::Value {
    let probe = format!("v = {raw}");
    match probe.parse::<toml::Table>() {
        Ok(mut table) => table
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_owned())),
        Err(_) => toml::Value::String(raw.to_owned()),
    }
}

fn insert(
    root: &mut toml::Table,
    key: &str,
    value: toml::Value,
    origin: &str,
) -> Result<(), ConfigError> {
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|part| part.is_empty()) {
        return Err(ConfigError::Invalid {
            origin: origin.to_owned(),
            reason: format!("malformed key {key:?}"),
        });
    }
    let (last, parents) = parts.split_last().unwrap_or((&"", &[]));
    let mut table = root;
    for part in parents {
        let entry = table
            .entry((*part).to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(inner) => inner,
            _ => {
                return Err(ConfigError::Invalid {
                    origin: origin.to_owned(),
                    reason: format!("{part} is a value, not a section"),
                });
            }
        };
    }
    table.insert((*last).to_owned(), value);
    Ok(())
}

fn merge(into: &mut toml::Table, from: toml::Table) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(toml::Value::Table(existing)), toml::Value::Table(incoming)) => {
                merge(existing, incoming)
            }
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

/// A duration in a config file: `"250ms"`, `"30s"`, `"5m"`, `"1h"`.
pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn parse(text: &str) -> Result<Duration, String> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let number: u64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a duration like 30s or 250ms"))?;
        let duration = match unit {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number * 60),
            "h" => Duration::from_secs(number * 3600),
            _ => return Err(format!("{text:?} has no unit (ms, s, m or h)")),
        };
        Ok(duration)
    }

    pub fn format(duration: &Duration) -> String {
        if duration.subsec_millis() != 0 || duration.as_secs() == 0 {
            format!("{}ms", duration.as_millis())
        } else {
            format!("{}s", duration.as_secs())
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse(&text).map_err(serde::de::Error::custom)
    }

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format(duration))
    }
}

/// Serde for lists of durations written like `["1s", "5s"]`.
pub mod durations {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<Duration>, D::Error> {
        Vec::<String>::deserialize(deserializer)?
            .iter()
            .map(|text| super::duration::parse(text).map_err(serde::de::Error::custom))
            .collect()
    }

    pub fn serialize<S: Serializer>(
        durations: &[Duration],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(durations.iter().map(super::duration::format))
    }
}

/// Settings every service shares.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoreConfig {
    /// NATS server URL, or several comma-separated (`nats://a:4222,nats://b:4222`,
    /// a cluster's seeds) (`ZOPU_NATS_URL`).
    pub nats_url: String,
    /// Where services keep their SQLite projections and workspaces (`ZOPU_DATA_DIR`).
    pub data_dir: PathBuf,
    /// Replicas of `ZOPU_EVENTS` and the artifact bucket (1 in dev, 3 in a cluster).
    pub stream_replicas: usize,
    /// JetStream duplicate window for `Nats-Msg-Id` deduplication.
    #[serde(with = "duration")]
    pub duplicate_window: std::time::Duration,
    /// How long a service waits for in-flight messages on the first shutdown signal.
    #[serde(with = "duration")]
    pub shutdown_grace: std::time::Duration,
    /// How the instances of a service share its reactions (`[scale]`).
    pub scale: ScaleConfig,
    /// Projection snapshots (`[snapshots]`, [`crate::snapshot`]).
    pub snapshots: SnapshotConfig,
    /// The wall clock and fresh-id source of the services started with this
    /// config (the machine's; tests inject a [`crate::clock::ManualClock`]).
    /// Not a setting: never read from a file or the environment.
    #[serde(skip)]
    pub clock: crate::clock::Clock,
}

/// How several instances of one service share its reaction consumers
/// (services/README.md "Scaling out"): each reaction has `partitions` durable consumers;
/// each partition is worked by one live instance at a time, agreed through
/// the `zopu-leases` bucket.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScaleConfig {
    /// This instance's name in the leases bucket; 1–64 of `[A-Za-z0-9_-]`.
    /// Empty (the default): `<host>-<pid>-<random>`, new at every start.
    pub instance_id: String,
    /// Partitions of every reaction (1–64). Every instance of a deployment
    /// must use the same count; a new count is a new set of consumers,
    /// which replays each reaction's history through its idempotency checks.
    pub partitions: u32,
    /// An instance that has not renewed its heartbeat for this long is
    /// taken for dead and its partitions move to the others.
    #[serde(with = "duration")]
    pub lease_ttl: std::time::Duration,
}

impl Default for ScaleConfig {
    fn default() -> Self {
        Self {
            instance_id: String::new(),
            partitions: 1,
            lease_ttl: std::time::Duration::from_secs(3),
        }
    }
}

impl ScaleConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.instance_id.is_empty()
            && !zopu_schema::subjects::is_valid_instance_id(&self.instance_id)
        {
            return Err(ConfigError::setting(
                "scale.instance_id",
                format!(
                    "{:?} must be 1-64 of letters, digits, '-' or '_'",
                    self.instance_id
                ),
            ));
        }
        if !(1..=64).contains(&self.partitions) {
            return Err(ConfigError::setting("scale.partitions", "must be 1..=64"));
        }
        if !(std::time::Duration::from_millis(500)..=std::time::Duration::from_secs(300))
            .contains(&self.lease_ttl)
        {
            return Err(ConfigError::setting(
                "scale.lease_ttl",
                "must be 500ms..=300s",
            ));
        }
        Ok(())
    }

    /// The configured instance id, or a fresh `<host>-<pid>-<random>`.
    pub fn resolved_instance_id(&self) -> String {
        if !self.instance_id.is_empty() {
            return self.instance_id.clone();
        }
        let host: String = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .trim()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .take(32)
            .collect();
        let host = if host.is_empty() {
            "instance".to_owned()
        } else {
            host
        };
        format!(
            "{host}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        )
    }
}

/// When a service stores a snapshot of its projection file and whether it
/// starts from one (services/README.md, "Snapshots").
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SnapshotConfig {
    /// Restore from and store snapshots; off: every start replays the
    /// stream from the file's checkpoint (from 1 for a new file).
    pub enabled: bool,
    /// Events the projections must have applied since the last snapshot
    /// (this instance's or another's) before the next one is stored.
    pub every_events: u64,
    /// How often the instance looks whether a snapshot is due.
    #[serde(with = "duration")]
    pub check_interval: std::time::Duration,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            every_events: 50_000,
            check_interval: std::time::Duration::from_secs(60),
        }
    }
}

impl SnapshotConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(100..=100_000_000).contains(&self.every_events) {
            return Err(ConfigError::setting(
                "snapshots.every_events",
                "must be 100..=100000000",
            ));
        }
        if !(std::time::Duration::from_millis(100)..=std::time::Duration::from_secs(86_400))
            .contains(&self.check_interval)
        {
            return Err(ConfigError::setting(
                "snapshots.check_interval",
                "must be 100ms..=24h",
            ));
        }
        Ok(())
    }
}

/// Where projections and workspaces live unless `data_dir` says otherwise.
pub const DEFAULT_DATA_DIR: &str = ".zopu-local/data";

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            nats_url: "nats://127.0.0.1:4222".to_owned(),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            stream_replicas: 1,
            duplicate_window: std::time::Duration::from_secs(120),
            shutdown_grace: std::time::Duration::from_secs(10),
            scale: ScaleConfig::default(),
            snapshots: SnapshotConfig::default(),
            clock: crate::clock::Clock::system(),
        }
    }
}

impl CoreConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Err(reason) = crate::nats::server_list(&self.nats_url) {
            return Err(ConfigError::setting("nats_url", reason));
        }
        if !matches!(self.stream_replicas, 1 | 3 | 5) {
            return Err(ConfigError::setting("stream_replicas", "must be 1, 3 or 5"));
        }
        if self.duplicate_window < std::time::Duration::from_secs(1) {
            return Err(ConfigError::setting(
                "duplicate_window",
                "must be at least 1s",
            ));
        }
        self.scale.validate()?;
        self.snapshots.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Example {
        nats_url: String,
        sandbox: Sandbox,
    }

    #[derive(Debug, serde::Deserialize, PartialEq, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Sandbox {
        allow_local_repositories: bool,
        max_files: u32,
    }

    impl Default for Example {
        fn default() -> Self {
            Self {
                nats_url: "nats://default".into(),
                sandbox: Sandbox::default(),
            }
        }
    }

    #[test]
    fn layers_apply_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("zopu.toml");
        std::fs::write(
            &file,
            "nats_url = \"nats://file\"\n[sandbox]\nmax_files = 5\n",
        )
        .unwrap();
        let sources = Sources {
            file: Some(file),
            environment: vec![
                (
                    "ZOPU_SANDBOX__ALLOW_LOCAL_REPOSITORIES".into(),
                    "true".into(),
                ),
                ("ZOPU_SANDBOX__MAX_FILES".into(), "7".into()),
                ("ZOPU_LLM_API_KEY".into(), "sk-secret".into()),
                ("ZOPU_GATEWAY_LINK_KEY".into(), "a-secret-key".into()),
                ("PATH".into(), "/bin".into()),
            ],
            overrides: vec![("nats_url".into(), "nats://flag".into())],
        };
        let loaded: Example = load(&sources).unwrap();
        assert_eq!(loaded.nats_url, "nats://flag");
        assert!(loaded.sandbox.allow_local_repositories);
        assert_eq!(loaded.sandbox.max_files, 7);
    }

    #[test]
    fn the_harness_and_deploy_scripts_variables_are_not_settings() {
        let sources = Sources {
            environment: [
                ("ZOPU_TEST_NATS", "docker"),
                ("ZOPU_TEST_NATS_IMAGE", "nats:2.12"),
                ("ZOPU_KEEP_DEPLOY", "1"),
                ("ZOPU_REBUILD_BASE", "1"),
                ("ZOPU_DEBIAN_MIRROR", "http://deb.debian.org/debian"),
                ("ZOPU_DOCKERD_LOG", "/tmp/dockerd.log"),
                ("ZOPU_DOCKERD_WAIT", "60"),
                ("ZOPU_NATS_READY_TIMEOUT", "120"),
            ]
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect(),
            ..Default::default()
        };
        let loaded: Example = load(&sources).unwrap();
        assert_eq!(loaded.nats_url, "nats://default");
    }

    #[test]
    fn the_nats_credential_and_tls_variables_are_not_settings() {
        let sources = Sources {
            environment: [
                (crate::nats::USER_VARIABLE, "setup"),
                (crate::nats::PASSWORD_FILE_VARIABLE, "/run/secrets/nats"),
                (crate::nats::CA_FILE_VARIABLE, "/etc/zopu/ca.pem"),
                (crate::nats::CERT_FILE_VARIABLE, "/etc/zopu/client.pem"),
                (crate::nats::KEY_FILE_VARIABLE, "/etc/zopu/client.key"),
            ]
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect(),
            ..Default::default()
        };
        let loaded: Example = load(&sources).unwrap();
        assert_eq!(loaded.nats_url, "nats://default");
    }

    #[test]
    fn unknown_and_mistyped_keys_are_named() {
        let sources = Sources {
            environment: vec![("ZOPU_SANDBOX__ALOW".into(), "true".into())],
            ..Default::default()
        };
        let error = load::<Example>(&sources).unwrap_err().to_string();
        assert!(error.contains("alow"), "{error}");
        let sources = Sources {
            environment: vec![("ZOPU_SANDBOX__MAX_FILES".into(), "many".into())],
            ..Default::default()
        };
        let error = load::<Example>(&sources).unwrap_err().to_string();
        assert!(
            error.contains("max_files") || error.contains("integer"),
            "{error}"
        );
    }

    #[test]
    fn nats_url_takes_a_server_list_and_names_a_bad_entry() {
        let mut config = CoreConfig {
            nats_url: "nats://127.0.0.1:4222,nats://127.0.0.1:4223".into(),
            ..CoreConfig::default()
        };
        config.validate().unwrap();
        config.nats_url = "nats://127.0.0.1:4222,127.0.0.1:4223".into();
        let error = config.validate().unwrap_err();
        assert!(matches!(error, ConfigError::Setting { ref key, .. } if key == "nats_url"));
        let text = error.to_string();
        assert!(
            text.contains("entry 2") && text.contains("127.0.0.1:4223"),
            "{text}"
        );
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(
            duration::parse("250ms").unwrap(),
            std::time::Duration::from_millis(250)
        );
        assert_eq!(
            duration::parse("2m").unwrap(),
            std::time::Duration::from_secs(120)
        );
        assert!(duration::parse("10").is_err());
        assert!(duration::parse("x").is_err());
    }
}
