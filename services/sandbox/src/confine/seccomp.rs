//! The seccomp layer: the system calls a confined program is denied
//! (`EPERM` whatever their arguments), compiled once into a BPF program for
//! this architecture, and the modes it applies in.

use std::sync::OnceLock;

use super::ConfinementMode;

/// Whether the seccomp layer is applied in `mode` (bubblewrap needs the
/// system calls the filter denies; a refused mode runs nothing).
pub(super) fn seccomp_applies(mode: ConfinementMode) -> bool {
    matches!(
        mode,
        ConfinementMode::Landlock | ConfinementMode::Unconfined
    )
}

#[cfg(target_arch = "x86_64")]
pub(super) const SECCOMP_ARCH: Option<seccompiler::TargetArch> =
    Some(seccompiler::TargetArch::x86_64);
#[cfg(target_arch = "aarch64")]
pub(super) const SECCOMP_ARCH: Option<seccompiler::TargetArch> =
    Some(seccompiler::TargetArch::aarch64);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(super) const SECCOMP_ARCH: Option<seccompiler::TargetArch> = None;

/// System calls denied with `EPERM` whatever their arguments.
pub(super) fn seccomp_denied_syscalls() -> Vec<libc::c_long> {
    let mut calls = vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_setns,
        libc::SYS_unshare,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_clock_settime,
        libc::SYS_settimeofday,
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([libc::SYS_iopl, libc::SYS_ioperm]);
    calls
}

/// The seccomp filter, compiled once in the parent (`None`: unsupported
/// architecture or a build error, so the layer is inactive).
// `c_long` is `i64` on the 64-bit targets the filter supports, not on all.
#[allow(clippy::useless_conversion)]
pub(super) fn seccomp_program() -> Option<&'static seccompiler::BpfProgram> {
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule,
    };
    static PROGRAM: OnceLock<Option<BpfProgram>> = OnceLock::new();
    PROGRAM
        .get_or_init(|| {
            let arch = SECCOMP_ARCH?;
            let mut rules: std::collections::BTreeMap<i64, Vec<SeccompRule>> =
                seccomp_denied_syscalls()
                    .into_iter()
                    .map(|call| (i64::from(call), Vec::new()))
                    .collect();
            let socket_rules = [libc::AF_INET, libc::AF_INET6, libc::AF_PACKET]
                .into_iter()
                .map(|domain| {
                    SeccompCondition::new(
                        0,
                        SeccompCmpArgLen::Dword,
                        SeccompCmpOp::Eq,
                        u64::try_from(domain).unwrap_or(u64::MAX),
                    )
                    .and_then(|cond| SeccompRule::new(vec![cond]))
                })
                .collect::<Result<Vec<_>, _>>();
            let built = socket_rules
                .and_then(|socket_rules| {
                    rules.insert(i64::from(libc::SYS_socket), socket_rules);
                    SeccompFilter::new(
                        rules,
                        SeccompAction::Allow,
                        SeccompAction::Errno(u32::try_from(libc::EPERM).unwrap_or(1)),
                        arch,
                    )
                })
                .and_then(BpfProgram::try_from);
            match built {
                Ok(program) => Some(program),
                Err(error) => {
                    tracing::warn!(%error, "could not build the seccomp filter");
                    None
                }
            }
        })
        .as_ref()
}
