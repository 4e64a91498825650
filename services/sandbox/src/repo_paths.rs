//! Repository-relative paths as strings (`src/db/mod.rs`): the directory
//! of one, and a name joined beneath a directory, where the root is `""`.
//! Nothing here touches the file system; [`crate::policy::RelPath`] is the
//! checked form for opening files.

/// The directory holding `path` (`""` for a file at the root).
pub fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(directory, _)| directory)
}

/// `name` beneath `directory` (`name` alone beneath the root).
pub fn join(directory: &str, name: &str) -> String {
    if directory.is_empty() {
        name.to_owned()
    } else {
        format!("{directory}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_the_empty_directory() {
        assert_eq!(parent("src/db/mod.rs"), "src/db");
        assert_eq!(parent("Cargo.toml"), "");
        assert_eq!(join("", "Cargo.toml"), "Cargo.toml");
        assert_eq!(join("crates/cli", "src/main.rs"), "crates/cli/src/main.rs");
    }
}
