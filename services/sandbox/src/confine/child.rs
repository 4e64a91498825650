//! The code that runs in the child between `fork` and `exec`. This is the
//! only place in the crate that needs `unsafe` (`CommandExt::pre_exec`).
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::Command;

use landlock::{RulesetCreated, RulesetStatus};
use rustix::fs::{Mode, OFlags};
use rustix::process::{Resource, Rlimit};
use rustix::thread::UnshareFlags;
use seccompiler::BpfProgram;

use crate::policy::SandboxLimits;

/// Resource limits, computed before the fork.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rlimits([(Resource, u64); 5]);

impl Rlimits {
    pub(super) fn from_limits(limits: &SandboxLimits) -> Self {
        Self([
            (Resource::As, limits.memory_bytes),
            (Resource::Fsize, limits.file_size_bytes),
            (Resource::Nofile, limits.open_files),
            (Resource::Cpu, limits.cpu_seconds),
            (Resource::Core, 0),
        ])
    }
}

/// Everything the child applies to itself, prepared before the fork so
/// the child only makes system calls.
pub(super) struct Setup {
    rlimits: Option<Rlimits>,
    /// `uid_map` and `gid_map` contents, when entering namespaces.
    id_maps: Option<(Vec<u8>, Vec<u8>)>,
    ruleset: Option<RulesetCreated>,
    /// Compiled in the parent; installed last, right before `exec`.
    seccomp: Option<&'static BpfProgram>,
}

impl Setup {
    pub(super) fn namespaces_only() -> Self {
        Self {
            rlimits: None,
            id_maps: Some(id_maps()),
            ruleset: None,
            seccomp: None,
        }
    }

    pub(super) fn seccomp_only(program: &'static BpfProgram) -> Self {
        Self {
            rlimits: None,
            id_maps: None,
            ruleset: None,
            seccomp: Some(program),
        }
    }

    pub(super) fn full(
        rlimits: Rlimits,
        namespaces: bool,
        ruleset: Option<RulesetCreated>,
        seccomp: Option<&'static BpfProgram>,
    ) -> Self {
        Self {
            rlimits: Some(rlimits),
            id_maps: namespaces.then(id_maps),
            ruleset,
            seccomp,
        }
    }

    fn apply(&mut self) -> std::io::Result<()> {
        if let Some(Rlimits(limits)) = self.rlimits {
            for (resource, value) in limits {
                rustix::process::setrlimit(
                    resource,
                    Rlimit {
                        current: Some(value),
                        maximum: Some(value),
                    },
                )?;
            }
        }
        if let Some((uid_map, gid_map)) = &self.id_maps {
            // SAFETY: `unshare_unsafe` is unsafe only for CLONE_FILES,
            // which would invalidate descriptors the process holds;
            // only user and network namespaces are unshared here.
            unsafe {
                rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER | UnshareFlags::NEWNET)?
            };
            write_proc(c"/proc/self/setgroups", b"deny")?;
            write_proc(c"/proc/self/uid_map", uid_map)?;
            write_proc(c"/proc/self/gid_map", gid_map)?;
        }
        if let Some(ruleset) = self.ruleset.take() {
            let status = ruleset
                .restrict_self()
                .map_err(|_| std::io::Error::other("landlock"))?;
            if status.ruleset == RulesetStatus::NotEnforced {
                return Err(std::io::Error::other("landlock not enforced"));
            }
        }
        if let Some(program) = self.seccomp {
            // Sets no_new_privs, then seccomp(SET_MODE_FILTER); no
            // allocation on the success path.
            seccompiler::apply_filter(program).map_err(|_| std::io::Error::other("seccomp"))?;
        }
        Ok(())
    }
}

fn id_maps() -> (Vec<u8>, Vec<u8>) {
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    (
        format!("{uid} {uid} 1\n").into_bytes(),
        format!("{gid} {gid} 1\n").into_bytes(),
    )
}

fn write_proc(path: &std::ffi::CStr, bytes: &[u8]) -> std::io::Result<()> {
    let fd = rustix::fs::open(path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
    let written = rustix::io::write(&fd, bytes)?;
    if written == bytes.len() {
        Ok(())
    } else {
        Err(std::io::Error::other("short write"))
    }
}

/// Installs `setup` to run in the child before `exec`.
pub(super) fn install(cmd: &mut Command, mut setup: Setup) {
    // SAFETY: the closure runs in the forked child before exec. It only
    // makes system calls (setrlimit, unshare, open/write/close on
    // /proc/self, prctl, landlock_restrict_self and seccomp) on memory prepared
    // before the fork; it takes no lock and allocates nothing on its
    // success path, so it is safe after fork in a multithreaded parent.
    // On error it returns, and std reports the error from `spawn`.
    unsafe {
        cmd.pre_exec(move || setup.apply());
    }
}
