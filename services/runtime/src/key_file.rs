//! A development key kept in a file: generated once (32 random bytes, hex),
//! readable by its owner only, read back on every later start. Used only by
//! `zopu dev` for the secrets it would otherwise need from the environment
//! (the artifact link key, the secret store's key).

use std::path::Path;

use rand::RngCore;

/// The key text in `path`, trimmed; a new one written there when the file
/// does not exist.
pub fn read_or_generate(path: &Path) -> std::io::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => return Ok(text.trim().to_owned()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut random = [0u8; 32];
    rand::rng().fill_bytes(&mut random);
    let text = hex::encode(random);
    write_private(path, text.as_bytes())?;
    Ok(text)
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}
