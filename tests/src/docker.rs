//! The harness's nats-server in a container (`ZOPU_TEST_NATS=docker`, the
//! `testcontainers` feature): the configuration file and store that
//! `zopu_runtime::local_server` would give a child process, run by the nats
//! image (`ZOPU_TEST_NATS_IMAGE`, default `nats:2.12`: `make images` builds
//! it locally FROM scratch; the official image has the same layout). The
//! container shares the host's network, so the server listens on
//! 127.0.0.1 only, and mounts the temp store at its own path, as the
//! current user, so the files stay the test's. Kill is a SIGKILL of the
//! container; restart starts the same container on the same port and store.
//!
//! testcontainers is async and the harness is not (tests call
//! `NatsServer::start()` inside and outside a runtime): every Docker call
//! runs on this server's own runtime, on a thread of its own.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use testcontainers::bollard::Docker;
use testcontainers::bollard::query_parameters::KillContainerOptions;
use testcontainers::core::{Mount, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use zopu_runtime::local_server::{SyncPolicy, free_ports, write_standalone_config};

/// The image when `ZOPU_TEST_NATS_IMAGE` is unset.
pub const DEFAULT_IMAGE: &str = "nats:2.12";

/// How long a container may take to log that it is ready (or to listen again).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A nats-server container; removed when dropped.
pub struct DockerServer {
    runtime: DockerRuntime,
    container: Option<ContainerAsync<GenericImage>>,
    image: String,
    port: u16,
}

impl std::fmt::Debug for DockerServer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("DockerServer")
            .field("image", &self.image)
            .field("port", &self.port)
            .field(
                "container",
                &self.container.as_ref().map(|container| container.id()),
            )
            .finish()
    }
}

/// `name:tag` from `ZOPU_TEST_NATS_IMAGE` (or the default), checked.
pub fn image_from_env() -> Result<(String, String)> {
    let image = std::env::var("ZOPU_TEST_NATS_IMAGE").unwrap_or_else(|_| DEFAULT_IMAGE.to_owned());
    parse_image(&image)
}

fn parse_image(image: &str) -> Result<(String, String)> {
    let Some((name, tag)) = image.rsplit_once(':') else {
        bail!("ZOPU_TEST_NATS_IMAGE must be name:tag (e.g. {DEFAULT_IMAGE}), not `{image}`");
    };
    if name.is_empty() || tag.is_empty() || tag.contains('/') {
        bail!("ZOPU_TEST_NATS_IMAGE must be name:tag (e.g. {DEFAULT_IMAGE}), not `{image}`");
    }
    Ok((name.to_owned(), tag.to_owned()))
}

impl DockerServer {
    /// Starts the container on a free loopback port with `store_dir` as its
    /// store, and returns once the server logged that it is ready.
    pub fn start(store_dir: &Path, sync: SyncPolicy) -> Result<Self> {
        let (name, tag) = image_from_env()?;
        let port = free_ports(1)?[0];
        let config = write_standalone_config(store_dir, port, sync)?;
        let owner = std::fs::metadata(store_dir).context("temp store dir")?;
        let store = path_text(store_dir)?;
        let request = GenericImage::new(&name, &tag)
            .with_wait_for(WaitFor::message_on_stderr("Server is ready"))
            .with_network("host")
            .with_mount(Mount::bind_mount(store.clone(), store))
            .with_user(format!("{}:{}", owner.uid(), owner.gid()))
            .with_cmd(["-c".to_owned(), path_text(&config)?])
            .with_startup_timeout(START_TIMEOUT);
        let runtime = DockerRuntime::new()?;
        let image = format!("{name}:{tag}");
        let container = on_runtime(&runtime, request.start()).with_context(|| {
            format!(
                "starting {image} through testcontainers (is a Docker engine running? \
                 `make images` builds the image locally)"
            )
        })?;
        Ok(Self {
            runtime,
            container: Some(container),
            image,
            port,
        })
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The container's id.
    pub fn id(&self) -> Option<&str> {
        self.container.as_ref().map(|container| container.id())
    }

    /// SIGKILL of the container's server: nothing it did not sync survives.
    pub fn kill(&mut self) {
        let Some(id) = self.id().map(str::to_owned) else {
            return;
        };
        let killed = on_runtime(&self.runtime, async move {
            let docker = Docker::connect_with_local_defaults()?;
            docker
                .kill_container(&id, Some(KillContainerOptions::default()))
                .await?;
            // Returns once the container has stopped.
            let mut waits = docker.wait_container(
                &id,
                None::<testcontainers::bollard::query_parameters::WaitContainerOptions>,
            );
            futures::StreamExt::next(&mut waits).await;
            Ok::<_, testcontainers::bollard::errors::Error>(())
        });
        if let Err(error) = killed {
            eprintln!("harness: killing the nats container failed: {error}");
        }
    }

    /// Starts the container again (same port, same store) and waits until it listens.
    pub fn restart(&mut self) -> Result<()> {
        let container = self
            .container
            .as_ref()
            .context("the nats container was removed")?;
        on_runtime(&self.runtime, container.start())
            .with_context(|| format!("restarting the {} container", self.image))?;
        let deadline = Instant::now() + START_TIMEOUT;
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "the restarted {} container did not listen on 127.0.0.1:{} within {}s",
                    self.image,
                    self.port,
                    START_TIMEOUT.as_secs()
                );
            }
            // Polling a local port while the server starts; nothing to subscribe to yet.
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for DockerServer {
    fn drop(&mut self) {
        if let Some(container) = self.container.take()
            && let Err(error) = on_runtime(&self.runtime, container.rm())
        {
            eprintln!("harness: removing the nats container failed: {error}");
        }
    }
}

/// The runtime the Docker calls run on. Dropped without waiting for its
/// tasks (a runtime may not block while it is dropped inside another one).
struct DockerRuntime(Option<tokio::runtime::Runtime>);

impl DockerRuntime {
    fn new() -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("a runtime for the Docker calls")?;
        Ok(Self(Some(runtime)))
    }
}

impl Drop for DockerRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Runs `future` to completion on `runtime` from a thread of its own, so it
/// works whether or not the caller is inside another runtime.
fn on_runtime<F>(runtime: &DockerRuntime, future: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    let runtime = runtime
        .0
        .as_ref()
        .expect("the runtime is only taken when the server is dropped");
    std::thread::scope(|scope| {
        scope
            .spawn(|| runtime.block_on(future))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn path_text(path: &Path) -> Result<String> {
    path.to_str()
        .map(str::to_owned)
        .with_context(|| format!("{} is not UTF-8", PathBuf::from(path).display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_name_and_tag() {
        assert_eq!(
            parse_image("nats:2.12").unwrap_or_default(),
            ("nats".to_owned(), "2.12".to_owned())
        );
        assert_eq!(
            parse_image("registry.local:5000/nats:2.12").unwrap_or_default(),
            ("registry.local:5000/nats".to_owned(), "2.12".to_owned())
        );
        assert!(parse_image("nats").is_err());
        assert!(parse_image("registry.local:5000/nats").is_err());
        assert!(parse_image("nats:").is_err());
    }
}
