//! A private PostgreSQL cluster on a free port (Debian's `pg_createcluster`), for tests that
//! stop, restart or crash PostgreSQL: doing so cannot disturb the tests that share the machine's
//! main cluster. It is dropped (stopped and removed, with its configuration folder) when the
//! test ends, however it ends.
//!
//! Test code: it panics, with the tool's message, when a cluster tool fails.

use std::process::Command;
use uuid::Uuid;

/// A cluster of the test's own.
pub struct Cluster {
    /// The PostgreSQL major version (a folder of `/etc/postgresql`).
    pub version: String,
    /// Its name among the version's clusters.
    pub name: String,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .expect("run cluster tool");
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Cluster {
    /// Creates and starts a cluster on a free port (trust authentication).
    pub fn create() -> Self {
        let version = std::fs::read_dir("/etc/postgresql")
            .expect("Debian PostgreSQL layout")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .max()
            .expect("a PostgreSQL version");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let cluster = Cluster {
            version,
            name: format!("conveyor_{}", &Uuid::new_v4().simple().to_string()[..12]),
            port,
        };
        let port = port.to_string();
        run(
            "pg_createcluster",
            &[
                &cluster.version,
                &cluster.name,
                "-p",
                &port,
                "--",
                "--auth=trust",
            ],
        );
        cluster.ctl("start");
        cluster
    }

    /// `pg_ctlcluster ACTION` (`start`, `stop`, `restart`).
    pub fn ctl(&self, action: &str) {
        self.ctl_with(action, &[]);
    }

    /// `pg_ctlcluster ACTION OPTIONS...`, such as `restart -m immediate`.
    pub fn ctl_with(&self, action: &str, options: &[&str]) {
        let mut args = vec![
            "--skip-systemctl-redirect",
            &self.version,
            &self.name,
            action,
        ];
        args.extend_from_slice(options);
        run("pg_ctlcluster", &args);
    }

    /// Its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("pg_dropcluster")
            .args([&self.version, &self.name, "--stop"])
            .output();
    }
}
