//! `write_generated_file`: create-new writes under `<workspace>/.zopu/` only.
//!
//! `.zopu` is opened with `O_NOFOLLOW|O_DIRECTORY` relative to the root
//! descriptor (a symlinked `.zopu` is refused), each intermediate directory
//! is created with `mkdirat` and opened the same way, and the file is created
//! with `openat(O_CREAT|O_EXCL|O_NOFOLLOW)`: an existing file, symlink or
//! hard link at the target name makes the call fail; nothing is overwritten.

use std::fs::File;
use std::io::Write;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Error, ToolOutput};
use crate::policy::{PolicyError, RelPath, SandboxLimits, WorkspaceRoot};

/// Input of `write_generated_file`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteGeneratedFileInput {
    /// Path relative to `.zopu/`.
    pub path: String,
    pub content: String,
}

/// Output of `write_generated_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteGeneratedFileOutput {
    /// Path relative to the workspace root (`.zopu/...`).
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

impl ToolOutput for WriteGeneratedFileOutput {
    fn truncated(&self) -> bool {
        false
    }
}

pub(crate) fn write_generated_file(
    root: &WorkspaceRoot,
    limits: &SandboxLimits,
    input: &WriteGeneratedFileInput,
) -> Result<WriteGeneratedFileOutput, Error> {
    if input.content.len() > limits.max_write_bytes {
        return Err(Error::InvalidInput(format!(
            "content is {} bytes, sandbox.max_write_bytes is {}",
            input.content.len(),
            limits.max_write_bytes
        )));
    }
    let rel = RelPath::parse(&input.path, limits)?;
    let Some((name, dirs)) = rel.components().split_last() else {
        return Err(Error::InvalidInput("a file name is required".to_owned()));
    };
    let mut dir = root.open_generated_dir(true)?;
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    for (i, component) in dirs.iter().enumerate() {
        let shown = dirs[..=i].join("/");
        match rustix::fs::mkdirat(&dir, component.as_str(), Mode::RWXU) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => {
                return Err(PolicyError::Io {
                    path: shown,
                    source: e.into(),
                }
                .into());
            }
        }
        dir = rustix::fs::openat(&dir, component.as_str(), dir_flags, Mode::empty()).map_err(
            |e| match e {
                Errno::LOOP | Errno::NOTDIR => PolicyError::Symlink(shown.clone()),
                e => PolicyError::Io {
                    path: shown.clone(),
                    source: e.into(),
                },
            },
        )?;
    }
    let flags = OFlags::WRONLY
        | OFlags::CREATE
        | OFlags::EXCL
        | OFlags::NOFOLLOW
        | OFlags::CLOEXEC
        | OFlags::NONBLOCK;
    let fd = rustix::fs::openat(&dir, name.as_str(), flags, Mode::from_raw_mode(0o644)).map_err(
        |e| match e {
            Errno::EXIST => PolicyError::AlreadyExists(rel.as_string()),
            Errno::LOOP => PolicyError::Symlink(rel.as_string()),
            e => PolicyError::Io {
                path: rel.as_string(),
                source: e.into(),
            },
        },
    )?;
    let mut file = File::from(fd);
    file.write_all(input.content.as_bytes())?;
    file.sync_all()?;
    Ok(WriteGeneratedFileOutput {
        path: format!("{}/{}", crate::policy::GENERATED_DIR, rel.as_string()),
        bytes: input.content.len() as u64,
        sha256: hex::encode(Sha256::digest(input.content.as_bytes())),
    })
}
