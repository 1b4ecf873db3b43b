//! The dashboard's static files as the router serves them: content types, caching, the
//! Content-Security-Policy, no token needed, and sources that keep to what that policy allows.
//! (The browser-level test is `crates/conveyor/tests/dashboard_e2e.rs`.)

mod common;

use common::{auth, TestServer};
use conveyor_server::ServerConfig;
use reqwest::StatusCode;
use std::path::{Path, PathBuf};

async fn serve(auth_on: bool) -> TestServer {
    TestServer::start_with_options(ServerConfig::default(), auth(auth_on)).await
}

/// Every file under `ui/`, as its path below it (`views/jobs.js`).
fn ui_files() -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("read ui dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, root, out);
            } else {
                let relative = path.strip_prefix(root).expect("below ui/");
                out.push(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ui");
    let mut files = Vec::new();
    walk(&root, &root, &mut files);
    files.sort();
    files
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn every_file_is_served_with_its_type_policy_and_validator_and_without_a_token() {
    // With access control on: the page and its files carry no data, and the login page is
    // one of them.
    let served = serve(true).await;
    let http = &served.http;
    let mut paths = vec![("/".to_string(), "text/html; charset=utf-8")];
    for file in ui_files() {
        let expected = match file.rsplit('.').next() {
            Some("html") => "text/html; charset=utf-8",
            Some("css") => "text/css; charset=utf-8",
            Some("js") => "text/javascript; charset=utf-8",
            Some("svg") => "image/svg+xml",
            other => panic!("ui/{file}: no content type for {other:?}; add it to ui.rs"),
        };
        paths.push((format!("/ui/{file}"), expected));
    }
    for (path, content_type) in paths {
        let response = http.get(served.url(&path)).send().await.expect("GET");
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "{path} (is it listed in ui.rs?)"
        );
        assert_eq!(header(&response, "content-type"), content_type, "{path}");
        let csp = header(&response, "content-security-policy");
        for directive in [
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self'",
            "frame-ancestors 'none'",
            "object-src 'none'",
        ] {
            assert!(
                csp.contains(directive),
                "{path}: {directive} missing in {csp}"
            );
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        assert_eq!(header(&response, "x-content-type-options"), "nosniff");
        assert_eq!(header(&response, "cache-control"), "no-cache");
        let etag = header(&response, "etag");
        assert!(
            etag.starts_with('"') && etag.len() > 2,
            "{path}: etag {etag:?}"
        );

        // Revalidation: the same file answers 304 with no body.
        let again = http
            .get(served.url(&path))
            .header("if-none-match", &etag)
            .send()
            .await
            .expect("GET again");
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{path}");
        assert!(again.bytes().await.expect("body").is_empty());
    }

    // The API next to it still wants a token; an unknown file is a JSON 404.
    let api = http
        .get(served.url("/v1/queues"))
        .send()
        .await
        .expect("GET queues");
    assert_eq!(api.status(), StatusCode::UNAUTHORIZED);
    let missing = http
        .get(served.url("/ui/nope.js"))
        .send()
        .await
        .expect("GET missing");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert!(header(&missing, "content-type").starts_with("application/json"));
}

#[tokio::test]
async fn served_without_access_control_too() {
    let served = serve(false).await;
    let page = served
        .http
        .get(served.url("/"))
        .send()
        .await
        .expect("GET /");
    assert_eq!(page.status(), StatusCode::OK);
    let text = page.text().await.expect("body");
    assert!(text.contains(r#"<script type="module" src="/ui/app.js"></script>"#));
}

/// The sources keep to what the policy allows (no inline script or style, no event-handler
/// attributes) and never turn data into markup, which is what keeps payloads and error
/// messages from injecting anything.
#[test]
fn sources_need_nothing_the_policy_forbids() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ui");
    let index = std::fs::read_to_string(root.join("index.html")).expect("index.html");
    let lower = index.to_lowercase();
    assert!(!lower.contains("<style"), "inline <style> in index.html");
    assert!(!lower.contains(" style="), "style attribute in index.html");
    for (i, _) in lower.match_indices("<script") {
        let tag = &lower[i..i + lower[i..].find('>').expect("tag end")];
        assert!(tag.contains(" src="), "inline script in index.html: {tag}");
    }
    for attribute in [
        " onclick=",
        " onload=",
        " onerror=",
        " onsubmit=",
        "javascript:",
    ] {
        assert!(!lower.contains(attribute), "{attribute} in index.html");
    }
    for file in ui_files().iter().filter(|f| f.ends_with(".js")) {
        let source = std::fs::read_to_string(root.join(file)).expect("js source");
        for forbidden in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "setAttribute('style'",
        ] {
            assert!(!source.contains(forbidden), "ui/{file} uses {forbidden}");
        }
    }
}
