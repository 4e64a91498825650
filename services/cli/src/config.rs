//! The whole configuration: the shared settings at the top level and one
//! section per service. Every key is documented in README.md
//! ("Configuration"); unknown keys are errors.

use std::path::PathBuf;
use std::time::Duration;

use zopu_core::config::{ConfigError, CoreConfig, duration};

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ZopuConfig {
    pub nats_url: String,
    pub data_dir: PathBuf,
    pub stream_replicas: usize,
    #[serde(with = "duration")]
    pub duplicate_window: Duration,
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
}

impl Default for ZopuConfig {
    fn default() -> Self {
        let core = CoreConfig::default();
        Self {
            nats_url: core.nats_url,
            data_dir: core.data_dir,
            stream_replicas: core.stream_replicas,
            duplicate_window: core.duplicate_window,
            shutdown_grace: core.shutdown_grace,
        }
    }
}

impl ZopuConfig {
    pub fn core(&self) -> CoreConfig {
        CoreConfig {
            nats_url: self.nats_url.clone(),
            data_dir: self.data_dir.clone(),
            stream_replicas: self.stream_replicas,
            duplicate_window: self.duplicate_window,
            shutdown_grace: self.shutdown_grace,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.core().validate()
    }
}
