//! The artifact object store: names, idempotent writes, capped reads.
//!
//! A revision's page lives at `<artifact_id>/<revision>/<sha256>.html` in
//! [`ARTIFACTS_BUCKET`](zopu_schema::subjects::ARTIFACTS_BUCKET): the name is
//! content-addressed, so an object never changes once written, and two
//! instances that render one revision differently (one of them a stale
//! owner of the project's partition) write two objects instead of
//! replacing one; the `artifact.published` that wins names its own. A write
//! first looks for the object and reuses it, so a build re-run after a
//! crash stores nothing twice. A read stops at a byte cap and returns the
//! bytes with their digest.

use async_nats::jetstream::object_store::{InfoErrorKind, ObjectMetadata, ObjectStore};
use base64::Engine;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use zopu_schema::ArtifactId;

use crate::Error;

/// Content type of every stored page.
pub const HTML_CONTENT_TYPE: &str = "text/html; charset=utf-8";

/// `<artifact_id>/<revision>/<sha256>.html`.
pub fn object_name(artifact: &ArtifactId, revision: u32, sha256_hex: &str) -> String {
    format!("{artifact}/{revision}/{sha256_hex}.html")
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The object store's spelling of a digest (`SHA-256=<base64url>`), from hex.
fn nats_digest(sha256_hex: &str) -> Option<String> {
    let bytes = hex::decode(sha256_hex).ok()?;
    Some(format!(
        "SHA-256={}",
        base64::engine::general_purpose::URL_SAFE.encode(bytes)
    ))
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// An object with this name, digest and size was already there.
    Reused,
    Written,
}

/// Opens the artifact bucket (created by `zopu streams apply`: `zopu_runtime::streams::apply`).
pub async fn bucket(bus: &zopu_runtime::nats::Bus) -> Result<ObjectStore, Error> {
    zopu_runtime::nats::object_store(&bus.jetstream, zopu_schema::subjects::ARTIFACTS_BUCKET)
        .await
        .map_err(|error| Error::ObjectStore {
            operation: "open bucket",
            reason: error.to_string(),
        })
}

/// Stores `bytes` under `name` unless the same bytes are already there.
pub async fn put(
    store: &ObjectStore,
    name: &str,
    bytes: &[u8],
    sha256_hex: &str,
) -> Result<Stored, Error> {
    let expected = nats_digest(sha256_hex).ok_or_else(|| Error::ObjectStore {
        operation: "put",
        reason: "digest is not hex".into(),
    })?;
    match store.info(name).await {
        Ok(info)
            if !info.deleted
                && info.size == bytes.len()
                && info.digest.as_deref() == Some(expected.as_str()) =>
        {
            return Ok(Stored::Reused);
        }
        Ok(info) => {
            // A content-addressed name with other content: damaged or
            // written by something else. Write it again.
            tracing::warn!(
                object = name,
                size = info.size,
                "object with this name has other content; replacing it"
            );
        }
        Err(error) if error.kind() == InfoErrorKind::NotFound => {}
        Err(error) => {
            return Err(Error::ObjectStore {
                operation: "object info",
                reason: error.to_string(),
            });
        }
    }
    let metadata = ObjectMetadata {
        name: name.to_owned(),
        description: Some(HTML_CONTENT_TYPE.to_owned()),
        ..Default::default()
    };
    let mut reader = bytes;
    let info = store
        .put(metadata, &mut reader)
        .await
        .map_err(|error| Error::ObjectStore {
            operation: "put",
            reason: error.to_string(),
        })?;
    if info.digest.as_deref() != Some(expected.as_str()) || info.size != bytes.len() {
        return Err(Error::ObjectStore {
            operation: "put",
            reason: format!("stored object {name} does not have the digest that was written"),
        });
    }
    Ok(Stored::Written)
}

/// Reads the object `name`, at most `max_bytes`.
pub async fn read(store: &ObjectStore, name: &str, max_bytes: u64) -> Result<Vec<u8>, Error> {
    let object = store.get(name).await.map_err(|error| {
        if error.kind() == async_nats::jetstream::object_store::GetErrorKind::NotFound {
            Error::ObjectMissing {
                name: name.to_owned(),
            }
        } else {
            Error::ObjectStore {
                operation: "get",
                reason: error.to_string(),
            }
        }
    })?;
    let size = object.info().size as u64;
    if size > max_bytes {
        return Err(Error::TooLarge {
            name: name.to_owned(),
            size,
            max: max_bytes,
        });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    object
        .take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|error| Error::ObjectStore {
            operation: "read",
            reason: error.to_string(),
        })?;
    if bytes.len() as u64 > max_bytes {
        return Err(Error::TooLarge {
            name: name.to_owned(),
            size: bytes.len() as u64,
            max: max_bytes,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_digests() {
        let artifact = ArtifactId::derived(1_748_770_200_000, "a");
        assert_eq!(
            object_name(&artifact, 3, "ab12"),
            format!("{artifact}/3/ab12.html")
        );
        let hex = sha256_hex(b"hello");
        assert_eq!(
            hex,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(
            nats_digest(&hex).as_deref(),
            Some("SHA-256=LPJNul-wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=")
        );
        assert_eq!(nats_digest("not hex"), None);
    }
}
