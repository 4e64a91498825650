//! The generic confined runner: timeouts kill the process group, output is
//! capped, rlimits are set, the network is denied, the filesystem and exec
//! are restricted, and the refusal path names the opt-out setting.

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use zopu_sandbox::confine::{
    ConfineError, ConfinedCommand, Confinement, ConfinementMode, find_program,
};
use zopu_sandbox::policy::SandboxLimits;

fn bash() -> PathBuf {
    find_program("bash").expect("bash is installed")
}

fn command(program: PathBuf, args: &[&str], cwd: &Path, timeout: Duration) -> ConfinedCommand {
    ConfinedCommand {
        program,
        args: args.iter().map(OsString::from).collect(),
        cwd: cwd.to_path_buf(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        read_paths: vec![cwd.to_path_buf()],
        write_paths: Vec::new(),
        exec_paths: Vec::new(),
        timeout,
        output_cap: 64 * 1024,
    }
}

fn confinements() -> Vec<Confinement> {
    let landlock = Confinement::probe(&SandboxLimits::default());
    let bwrap = Confinement::probe(&SandboxLimits {
        prefer_bubblewrap: true,
        ..SandboxLimits::default()
    });
    let mut all = vec![landlock];
    if bwrap.report().mode != all[0].report().mode {
        all.push(bwrap);
    }
    all.retain(|c| c.report().mode != ConfinementMode::Refused);
    eprintln!(
        "modes under test: {:?}",
        all.iter().map(|c| c.report().clone()).collect::<Vec<_>>()
    );
    all
}

#[test]
fn hanging_command_is_killed_with_its_group() {
    let dir = tempfile::tempdir().expect("tmp");
    for c in confinements() {
        // A grandchild in the background must die too, or stdout never closes.
        let mut cmd = command(
            bash(),
            &["-c", "sleep 30 & sleep 30"],
            dir.path(),
            Duration::from_secs(1),
        );
        cmd.exec_paths.push(find_program("sleep").expect("sleep"));
        let out = c.run(&cmd).expect("runs");
        assert!(out.timed_out, "{out:?}");
        assert!(out.duration < Duration::from_secs(5), "{:?}", out.duration);
        assert!(out.exit_code.is_none() && out.signal == Some(9), "{out:?}");
    }
}

#[test]
fn an_abort_kills_the_running_program_and_refuses_the_next() {
    let dir = tempfile::tempdir().expect("tmp");
    for (round, c) in confinements().into_iter().enumerate() {
        // A duration no other test uses, so this round's program is told
        // apart from every other process.
        let program = format!("sleep {}", 41 + round);
        let script = format!("{program} & {program}");
        let mut cmd = command(
            bash(),
            &["-c", &script],
            dir.path(),
            Duration::from_secs(60),
        );
        cmd.exec_paths.push(find_program("sleep").expect("sleep"));
        let runner = c.clone();
        let running = std::thread::spawn(move || runner.run(&cmd));
        // Abort once the program is under way (well before its 60 s timeout).
        wait_until_running(&program);
        let aborted_at = std::time::Instant::now();
        c.abort();
        let out = running.join().expect("joins").expect("runs");
        assert!(
            aborted_at.elapsed() < Duration::from_secs(3),
            "{:?}",
            aborted_at.elapsed()
        );
        assert!(!out.timed_out && out.signal == Some(9), "{out:?}");
        let next = command(bash(), &["-c", "true"], dir.path(), Duration::from_secs(5));
        assert!(matches!(c.run(&next), Err(ConfineError::Aborted)));
    }
}

#[test]
fn output_is_capped_and_the_writer_killed() {
    let dir = tempfile::tempdir().expect("tmp");
    for c in confinements() {
        let mut cmd = command(
            find_program("yes").expect("yes"),
            &[],
            dir.path(),
            Duration::from_secs(20),
        );
        cmd.output_cap = 10_000;
        let out = c.run(&cmd).expect("runs");
        assert!(
            out.stdout_truncated && out.stdout.len() == 10_000,
            "{}",
            out.stdout.len()
        );
        assert!(!out.timed_out && out.duration < Duration::from_secs(10));
    }
}

#[test]
fn rlimits_and_cleared_env_apply() {
    let dir = tempfile::tempdir().expect("tmp");
    for c in confinements() {
        let cmd = command(
            bash(),
            &[
                "-c",
                "ulimit -n; ulimit -c; ulimit -v; ulimit -t; env | sort",
            ],
            dir.path(),
            Duration::from_secs(10),
        );
        let out = c.run(&cmd).expect("runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(&lines[..4], ["256", "0", "1048576", "10"], "{text}");
        assert!(!text.contains("HOME=") && !text.contains("CARGO"), "{text}");
    }
}

/// A confined command cannot connect to a listener on 127.0.0.1, while the
/// same command unconfined can (so the test is not vacuous).
#[test]
fn network_is_denied() {
    let dir = tempfile::tempdir().expect("tmp");
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("addr").port();
    let script = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");
    let control = std::process::Command::new(bash())
        .args(["-c", &script])
        .output()
        .expect("control");
    assert_eq!(
        String::from_utf8_lossy(&control.stdout).trim(),
        "connected",
        "control must connect"
    );
    let all = confinements();
    if all.is_empty() {
        // No network-denying layer here: the runner must refuse instead.
        let c = Confinement::probe(&SandboxLimits::default());
        let err = c
            .run(&command(
                bash(),
                &["-c", &script],
                dir.path(),
                Duration::from_secs(5),
            ))
            .expect_err("refused");
        assert!(matches!(err, ConfineError::Unconfined));
        return;
    }
    for c in all {
        assert!(c.report().denies_network(), "{:?}", c.report());
        let out = c
            .run(&command(
                bash(),
                &["-c", &script],
                dir.path(),
                Duration::from_secs(10),
            ))
            .expect("runs");
        assert_ne!(
            out.exit_code,
            Some(0),
            "{:?} connected: {out:?}",
            c.report().mode
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("connected"));
    }
}

#[test]
fn filesystem_and_exec_are_restricted_by_landlock() {
    let c = Confinement::probe(&SandboxLimits::default());
    if c.report().mode != ConfinementMode::Landlock {
        eprintln!("landlock not active here: {:?}", c.report());
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("inside.txt"), "inside").expect("write");
    let run = |script: &str| {
        c.run(&command(
            bash(),
            &["-c", script],
            dir.path(),
            Duration::from_secs(10),
        ))
        .expect("runs")
    };
    let ok = run("read -r line < inside.txt; echo -n \"$line\"");
    assert_eq!(ok.stdout, b"inside", "{ok:?}");
    let passwd = run("read -r line < /etc/passwd && echo \"$line\"");
    assert_ne!(passwd.exit_code, Some(0), "read /etc/passwd: {passwd:?}");
    let write = run("echo x > inside.txt");
    assert_ne!(
        write.exit_code,
        Some(0),
        "wrote the read-only tree: {write:?}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("inside.txt")).expect("read"),
        "inside"
    );
    let tmp = run("echo x > \"$TMPDIR/t\" && read -r l < \"$TMPDIR/t\" && echo \"$l\"");
    assert_eq!(tmp.stdout, b"x\n", "private tmp is writable: {tmp:?}");
    let exec = run("/usr/bin/id");
    assert_ne!(
        exec.exit_code,
        Some(0),
        "executed a program outside the allowlist: {exec:?}"
    );
}

#[test]
fn refusal_names_the_opt_out_setting() {
    let limits = SandboxLimits::default();
    let mut report = Confinement::probe(&limits).report().clone();
    report.mode = ConfinementMode::Refused;
    let c = Confinement::with_report(report, &limits);
    let dir = tempfile::tempdir().expect("tmp");
    let err = c
        .run(&command(
            bash(),
            &["-c", "true"],
            dir.path(),
            Duration::from_secs(5),
        ))
        .expect_err("refused");
    let msg = err.to_string();
    assert!(matches!(err, ConfineError::Unconfined));
    assert!(
        msg.contains("sandbox.allow_unconfined_exec")
            && msg.contains("ZOPU_SANDBOX__ALLOW_UNCONFINED_EXEC"),
        "{msg}"
    );
}

#[test]
fn report_lists_active_layers() {
    let c = Confinement::probe(&SandboxLimits::default());
    let layers = c.report().active_layers();
    eprintln!("confinement report: {:?}; layers: {layers:?}", c.report());
    assert!(layers.contains(&"rlimits"));
}

/// Confinements whose report says the seccomp filter is active.
fn seccomp_confinements() -> Vec<Confinement> {
    let all: Vec<Confinement> = confinements()
        .into_iter()
        .filter(|c| c.report().seccomp)
        .collect();
    if all.is_empty() {
        eprintln!("seccomp not active here");
    }
    all
}

#[test]
fn seccomp_denies_inet_sockets_but_not_unix_ones() {
    let Some(python) = find_program("python3") else {
        eprintln!("python3 not installed");
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    for c in seccomp_confinements() {
        assert!(c.report().active_layers().contains(&"seccomp"));
        let run = |family: &str| {
            let script = format!("import socket; socket.socket(socket.{family}); print('created')");
            c.run(&command(
                python.clone(),
                &["-c", &script],
                dir.path(),
                Duration::from_secs(20),
            ))
            .expect("runs")
        };
        let unix = run("AF_UNIX");
        assert_eq!(unix.exit_code, Some(0), "AF_UNIX socket refused: {unix:?}");
        assert_eq!(unix.stdout, b"created\n", "{unix:?}");
        for family in ["AF_INET", "AF_INET6"] {
            let out = run(family);
            assert_ne!(out.exit_code, Some(0), "{family} socket created: {out:?}");
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"),
                "{family}: {out:?}"
            );
        }
    }
}

#[test]
fn seccomp_denies_unshare() {
    let Some(unshare) = find_program("unshare") else {
        eprintln!("unshare not installed");
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    for c in seccomp_confinements() {
        let mut cmd = command(
            unshare.clone(),
            &["-U", "true"],
            dir.path(),
            Duration::from_secs(10),
        );
        cmd.exec_paths.push(find_program("true").expect("true"));
        let out = c.run(&cmd).expect("runs");
        assert_ne!(out.exit_code, Some(0), "unshare -U succeeded: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"),
            "{out:?}"
        );
    }
}

#[test]
fn seccomp_keeps_tools_working() {
    let git = find_program("git").expect("git is installed");
    let dir = tempfile::tempdir().expect("tmp");
    for c in seccomp_confinements() {
        let out = c
            .run(&command(
                git.clone(),
                &["--version"],
                dir.path(),
                Duration::from_secs(10),
            ))
            .expect("runs");
        assert_eq!(out.exit_code, Some(0), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("git version"),
            "{out:?}"
        );
    }
}

/// Waits (up to 30 s) until a process of this test's runs `command_line`
/// (its arguments joined by spaces): the confined program is under way.
/// The processes are read from `/proc`, where a confined child shows too.
fn wait_until_running(command_line: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let running = std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().parse::<u32>().is_ok())
            .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
            .any(|cmdline| {
                let words: Vec<String> = cmdline
                    .split(|byte| *byte == 0)
                    .filter(|word| !word.is_empty())
                    .map(|word| String::from_utf8_lossy(word).into_owned())
                    .collect();
                words.join(" ").ends_with(command_line) && words.len() == 2
            });
        if running {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "`{command_line}` never ran"
        );
        // Polling /proc: nothing announces a process's start.
        std::thread::sleep(Duration::from_millis(10));
    }
}
