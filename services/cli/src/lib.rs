//! The `zopu` command's library: the configuration every command loads
//! ([`ZopuConfig`]), what every command gets ([`Context`]), the commands
//! themselves (`commands`, one module per command) and the service runner
//! `zopu run` and `zopu dev` use (`commands::services`). The `zopu` binary
//! (`main.rs`) parses the command line onto it; the benchmark binary
//! (`zopu-bench`, services/bench) runs the services through it too.
//!
//! Invariant: this is the only crate that prints for humans (with
//! `zopu-bench`); every command that prints results accepts `--json` (one
//! JSON object per line).

pub mod commands;
pub mod config;

use std::path::PathBuf;
use std::process::ExitCode;

pub use config::ZopuConfig;

/// What every command gets.
#[derive(Debug)]
pub struct Context {
    pub config: ZopuConfig,
    pub json: bool,
}

impl Context {
    /// The author of what this command records: `--as` / `ZOPU_OPERATOR` /
    /// `operator`, else the account running it (`$USER`, `$LOGNAME`, else
    /// the name `/etc/passwd` gives this process's user id); an error when
    /// there is none, so nothing is recorded under a made-up name.
    pub fn operator(&self) -> anyhow::Result<zopu_schema::pb::Actor> {
        let user = ["USER", "LOGNAME"]
            .into_iter()
            .find_map(|name| std::env::var(name).ok().filter(|user| !user.is_empty()))
            .or_else(account_name);
        operator_from(self.config.operator.as_deref(), user.as_deref())
    }

    /// Connects to the configured NATS server (streams are applied by services; commands only read and append).
    pub async fn connect(&self) -> anyhow::Result<zopu_runtime::nats::Bus> {
        let url = &self.config.nats_url;
        zopu_runtime::nats::connect(url, "zopu-cli", std::time::Duration::from_secs(5))
            .await
            .map_err(|error| anyhow::anyhow!("{error}\nhint: start everything with `make run`, or point --nats / ZOPU_NATS_URL at a running server"))
    }
}

/// The name of the account this process runs as, from `/etc/passwd` (a
/// container often sets no `$USER`).
fn account_name() -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let uid = std::fs::metadata("/proc/self").ok()?.uid().to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        (fields.nth(1)? == uid && !name.is_empty()).then(|| name.to_owned())
    })
}

fn operator_from(
    configured: Option<&str>,
    user: Option<&str>,
) -> anyhow::Result<zopu_schema::pb::Actor> {
    let id = match (configured, user.filter(|user| !user.is_empty())) {
        (Some(operator), _) => operator,
        (None, Some(user)) => {
            config::check_operator(user).map_err(|error| {
                anyhow::anyhow!("{error} (the account running zopu); name yourself with --as USER")
            })?;
            user
        }
        (None, None) => anyhow::bail!(
            "who is recording this? No operator is set and the account running zopu has no name \
             ($USER, $LOGNAME, /etc/passwd): pass --as USER (or set ZOPU_OPERATOR, or `operator` in \
             the configuration file); nothing was recorded"
        ),
    };
    Ok(zopu_schema::pb::Actor {
        kind: zopu_schema::pb::actor::Kind::User as i32,
        id: id.to_owned(),
    })
}

/// The options every command of `zopu` and `zopu-bench` takes, before or
/// after its name.
#[derive(Debug, clap::Args)]
pub struct GlobalArgs {
    /// NATS server URL, or a cluster's as a comma-separated list (nats://a:4222,nats://b:4222) [env: ZOPU_NATS_URL] [default: nats://127.0.0.1:4222]
    #[arg(long, global = true, value_name = "URL")]
    pub nats: Option<String>,
    /// Directory for projections, workspaces and local state [env: ZOPU_DATA_DIR]
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// TOML configuration file [env: ZOPU_CONFIG]
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print results as JSON lines
    #[arg(long, global = true)]
    pub json: bool,
}

impl GlobalArgs {
    /// The settings every command loads first: the configuration file
    /// (`--config`, else `ZOPU_CONFIG`), `ZOPU_*` variables, then these
    /// flags and `operator` (`--as`), resolved and validated.
    pub fn load_config(&self, operator: Option<&str>) -> anyhow::Result<ZopuConfig> {
        let mut sources = zopu_runtime::config::Sources::from_process(self.config.clone());
        if let Some(url) = &self.nats {
            sources = sources.set("nats_url", format!("{url:?}"));
        }
        if let Some(dir) = &self.data_dir {
            sources = sources.set("data_dir", format!("{:?}", dir.display().to_string()));
        }
        if let Some(operator) = operator {
            sources = sources.set("operator", format!("{operator:?}"));
        }
        let config: ZopuConfig = zopu_runtime::config::load::<ZopuConfig>(&sources)?.resolved();
        config.validate()?;
        Ok(config)
    }
}

/// Runs a command's future on the multi-threaded runtime every binary of
/// the workspace uses; its error is printed, and the exit code is 1.
pub fn block_on_command(
    command: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // A turn's future (decide, fall back, append with a verified head)
        // is deep; tokio's 2 MiB default once overflowed in a debug build
        // under the chaos run. Stacks are reserved, not committed: 8 MiB
        // costs memory only where it is used.
        .thread_stack_size(8 * 1024 * 1024)
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(command) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Every argument and subcommand of `command` (named `name`) without help
/// text, as `"<path> <argument>"`: each binary's test asks for none.
pub fn undocumented(command: &clap::Command, name: &str) -> Vec<String> {
    fn walk(command: &clap::Command, path: &str, found: &mut Vec<String>) {
        for argument in command.get_arguments() {
            let id = argument.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            if argument.get_help().is_none() && argument.get_long_help().is_none() {
                found.push(format!("{path} {id}"));
            }
        }
        for sub in command.get_subcommands() {
            let path = format!("{path} {}", sub.get_name());
            if sub.get_about().is_none() && sub.get_long_about().is_none() {
                found.push(format!("{path} (the command)"));
            }
            walk(sub, &path, found);
        }
    }
    let mut found = Vec::new();
    walk(command, name, &mut found);
    found
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_operator_is_the_one_named_else_the_user_else_refused() {
        let id = |configured, user| super::operator_from(configured, user).map(|actor| actor.id);
        assert_eq!(id(Some("ada"), Some("root")).unwrap(), "ada");
        assert_eq!(id(None, Some("grace")).unwrap(), "grace");
        for user in [None, Some("")] {
            let refused = id(None, user).unwrap_err().to_string();
            assert!(refused.contains("--as USER"), "{refused}");
        }
        let invalid = id(None, Some("a b")).unwrap_err().to_string();
        assert!(invalid.contains("--as USER"), "{invalid}");
        assert!(super::config::check_operator("cli bot").is_err());
        // This test's own account has a name in /etc/passwd.
        assert!(super::account_name().is_some_and(|name| !name.is_empty()));
    }
}
