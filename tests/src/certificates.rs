//! Certificates for TLS tests, made with the `openssl` command: a CA, and a
//! server and a client certificate for 127.0.0.1 signed by it (EC P-256,
//! valid two days), in a temporary directory as `ca.pem`, `server.pem`,
//! `server.key`, `client.pem` and `client.key`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all
/// signed by the CA, made with the `openssl` command.
#[derive(Debug)]
pub struct Certificates {
    dir: tempfile::TempDir,
}

impl Certificates {
    pub fn make() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let run = |arguments: &[&str]| -> Result<()> {
            let output = Command::new("openssl")
                .args(arguments)
                .current_dir(dir.path())
                .output()
                .context("running openssl (install the openssl package)")?;
            ensure!(
                output.status.success(),
                "openssl {}: {}",
                arguments.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
            Ok(())
        };
        let key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        run(&[
            &["req", "-x509"][..],
            &key,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=zopu-test-ca",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        ]
        .concat())?;
        for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
            let extensions = format!("{name}.ext");
            std::fs::write(
                dir.path().join(&extensions),
                format!("subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n"),
            )?;
            let (key_file, request, certificate) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
            );
            run(&[
                &["req"][..],
                &key,
                &[
                    "-keyout",
                    &key_file,
                    "-out",
                    &request,
                    "-subj",
                    &format!("/CN=zopu-test-{name}"),
                ],
            ]
            .concat())?;
            run(&[
                "x509",
                "-req",
                "-in",
                &request,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &extensions,
                "-out",
                &certificate,
            ])?;
        }
        Ok(Self { dir })
    }

    /// A file of the set (`ca.pem`, `server.pem`, `server.key` ...).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}
