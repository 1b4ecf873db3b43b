//! The example runs to its end on a fresh file: every job completed, the retried one on its
//! second attempt.

#[test]
fn the_example_completes_every_job() {
    let dir = std::env::temp_dir().join(format!("conveyor-embedded-{}", std::process::id()));
    let db = dir.join("embedded.db");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_conveyor-example-embedded"))
        .arg(&db)
        .output()
        .expect("run the example");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout.matches("Completed after 1 attempt").count(),
        2,
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("Completed after 2 attempt").count(),
        1,
        "{stdout}"
    );
}
