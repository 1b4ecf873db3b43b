//! `conveyor serve --config FILE` (or `CONVEYOR_CONFIG`): settings from a TOML file, one key
//! per flag (`max_payload_bytes = 1048576` or `max-payload-bytes`; lists for repeatable flags).
//!
//! Precedence, highest first: a flag on the command line, its `CONVEYOR_*` environment
//! variable, the file, the default. The file is applied by setting the variable of each key
//! that is not already set, before the command line is parsed (clap then ranks a flag above
//! its variable), so every flag needs a variable; `every_serve_flag_has_an_environment_variable`
//! holds that.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::CommandFactory;

/// The file `--config` names on a `serve` command line, or `CONVEYOR_CONFIG`.
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut rest = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned());
    // Only `serve` reads one; global options never come before it.
    if rest.next().as_deref() != Some("serve") {
        return None;
    }
    let mut rest = rest.peekable();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            break;
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
        if arg == "--config" {
            return rest.next().map(PathBuf::from);
        }
    }
    std::env::var_os("CONVEYOR_CONFIG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// One setting as the text its variable would hold.
fn as_text(key: &str, value: &toml::Value, list: bool) -> Result<String, String> {
    match value {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(n) => Ok(n.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Array(items) if list => items
            .iter()
            .map(|item| as_text(key, item, false))
            .collect::<Result<Vec<_>, _>>()
            .map(|items| items.join(",")),
        toml::Value::Array(_) => Err(format!("`{key}` takes one value, not a list")),
        other => Err(format!(
            "`{key}` must be a string, number or boolean, not {}",
            other.type_str()
        )),
    }
}

/// Applies the config file of a `serve` command line, if any, to the environment. Must run
/// before any thread starts (it sets environment variables).
pub(crate) fn apply(args: &[OsString]) -> Result<(), String> {
    let Some(path) = config_path(args) else {
        return Ok(());
    };
    let shown = path.display();
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("--config {shown}: cannot read it: {e}"))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| format!("--config {shown}: not valid TOML: {e}"))?;
    let command = super::Cli::command();
    let Some(serve) = command.find_subcommand("serve") else {
        return Ok(());
    };
    for (key, value) in &table {
        let flag = key.replace('_', "-");
        let arg = serve
            .get_arguments()
            .find(|arg| arg.get_long() == Some(flag.as_str()) && flag != "config")
            .ok_or_else(|| {
                let mut known: Vec<String> = serve
                    .get_arguments()
                    .filter_map(|arg| arg.get_long())
                    .filter(|long| !matches!(*long, "config" | "help"))
                    .map(|long| long.replace('-', "_"))
                    .collect();
                known.sort();
                format!(
                    "--config {shown}: unknown setting `{key}`; settings are the flags of \
                     `conveyor serve --help`: {}",
                    known.join(", ")
                )
            })?;
        let Some(variable) = arg.get_env() else {
            return Err(format!(
                "--config {shown}: `{key}` cannot be set from a file (no CONVEYOR_* variable)"
            ));
        };
        if std::env::var_os(variable).is_some() {
            // The variable ranks above the file.
            continue;
        }
        let list = arg.get_value_delimiter().is_some();
        let text = as_text(key, value, list).map_err(|e| format!("--config {shown}: {e}"))?;
        std::env::set_var(variable, text);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &[&str]) -> Vec<OsString> {
        line.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_config_path_comes_from_a_serve_command_line_only() {
        assert_eq!(
            config_path(&args(&["conveyor", "serve", "--config", "a.toml"])),
            Some(PathBuf::from("a.toml"))
        );
        assert_eq!(
            config_path(&args(&["conveyor", "serve", "--demo", "--config=b.toml"])),
            Some(PathBuf::from("b.toml"))
        );
        assert_eq!(
            config_path(&args(&["conveyor", "queues", "--config", "a.toml"])),
            None
        );
    }

    #[test]
    fn values_become_their_variables_text() {
        let value = |text: &str| -> toml::Value {
            let table: toml::Table = format!("v = {text}").parse().expect("toml");
            table["v"].clone()
        };
        assert_eq!(as_text("k", &value("\"x\""), false).unwrap(), "x");
        assert_eq!(as_text("k", &value("5"), false).unwrap(), "5");
        assert_eq!(as_text("k", &value("true"), false).unwrap(), "true");
        assert_eq!(
            as_text("k", &value("[\"a=1\", \"2\"]"), true).unwrap(),
            "a=1,2"
        );
        assert!(as_text("k", &value("[1]"), false).is_err());
        assert!(as_text("k", &value("{ a = 1 }"), false).is_err());
    }
}
