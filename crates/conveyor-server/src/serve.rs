//! Serving the router on a TCP listener with the limits a public server needs: a cap on open
//! connections, a deadline for request headers (slowloris), a deadline for whole requests
//! (slow bodies), and closing connections that sit idle between requests.
//!
//! `axum::serve` has none of these: idle or one-byte-per-second clients can hold sockets
//! until the process runs out of file descriptors, after which it cannot even answer
//! `/healthz`.
//!
//! [`serve_tls`] does the same over TLS: the handshake happens in the connection's task, after
//! it took its place under the connection cap, and must finish within
//! [`ConnectionLimits::tls_handshake_timeout`], so a client that connects and says nothing
//! cannot hold a socket. A failed handshake (a plain-HTTP client, an untrusted or missing client
//! certificate) closes the connection.

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::error::ApiError;
use crate::tls::TlsConfig;

/// Limits on the connections [`serve`] keeps.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections served at once; further ones are accepted and closed at once, so the
    /// process never runs out of file descriptors.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers, from its first byte.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight and no bytes moving for this long is closed.
    pub idle_timeout: Duration,
    /// The longest a request may take from headers to response, body upload included. Must
    /// exceed the longest long-poll (`ServerConfig::max_fetch_wait`).
    pub request_timeout: Duration,
    /// How long a client may take to complete the TLS handshake, from its connection
    /// ([`serve_tls`] only).
    pub tls_handshake_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(90),
            tls_handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// Serves `app` on `listener` until `shutdown` is cancelled, then lets requests in flight
/// finish (long-polls answer at once on shutdown) for up to `request_timeout`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    serve_with(listener, app, limits, None, shutdown).await
}

/// [`serve`] over TLS: every connection first completes a handshake under `tls` (within
/// `limits.tls_handshake_timeout`), with a client certificate when `tls` requires one.
pub async fn serve_tls(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    tls: TlsConfig,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.inner);
    serve_with(listener, app, limits, Some(acceptor), shutdown).await
}

async fn serve_with(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let app = app.layer(axum::middleware::from_fn(move |request, next| {
        deadline(limits.request_timeout, request, next)
    }));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = JoinSet::new();
    let mut refused_logged = Instant::now() - Duration::from_secs(60);
    let mut accept_error_logged = Instant::now() - Duration::from_secs(60);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        while connections.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors, or a connection reset before it was accepted: not
                // fatal. Pause briefly so a persistent error does not spin the loop.
                if accept_error_logged.elapsed() > Duration::from_secs(5) {
                    tracing::warn!(%error, "accepting a connection failed");
                    accept_error_logged = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if refused_logged.elapsed() > Duration::from_secs(5) {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    "connection limit reached: closing new connections until some end"
                );
                refused_logged = Instant::now();
            }
            drop(stream);
            continue;
        };
        let app = app.clone();
        let shutdown = shutdown.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            serve_connection(stream, tls, app, limits, shutdown).await;
            drop(permit);
        });
    }
    // Stop accepting; give the connections in flight their graceful end.
    drop(listener);
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.request_timeout, drained)
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown deadline: closing them");
        connections.shutdown().await;
    }
    Ok(())
}

/// Answers 408 (`request_timeout`) when a request is not done within `limit`.
async fn deadline(limit: Duration, request: Request, next: axum::middleware::Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::RequestTimeout(limit).into_response(),
    }
}

/// When the connection last moved bytes, and how many requests it has in flight.
struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// Requests that reached the router on this connection.
    requests: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let now = self.epoch.elapsed();
        now.saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Decrements the in-flight count when a request's handling ends, however it ends.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

async fn serve_connection(
    stream: TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity {
        epoch: Instant::now(),
        last_ms: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
        requests: AtomicU64::new(0),
    });
    let tracked = Tracked {
        stream,
        activity: activity.clone(),
    };
    let Some(acceptor) = tls else {
        return run_connection(TokioIo::new(tracked), activity, app, limits, shutdown).await;
    };
    let handshake = tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(tracked));
    let stream = tokio::select! {
        _ = shutdown.cancelled() => return,
        done = handshake => match done {
            Ok(Ok(stream)) => stream,
            // Scanners, plain-HTTP clients and refused client certificates: not worth a warning.
            Ok(Err(error)) => {
                tracing::debug!(%error, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(timeout = ?limits.tls_handshake_timeout, "TLS handshake timed out");
                return;
            }
        },
    };
    run_connection(TokioIo::new(stream), activity, app, limits, shutdown).await;
}

/// Serves HTTP/1 or HTTP/2 on an established connection until it ends, goes idle, or the
/// server shuts down.
async fn run_connection<I>(
    io: I,
    activity: Arc<Activity>,
    app: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let requests = activity.clone();
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        requests.in_flight.fetch_add(1, Ordering::Relaxed);
        requests.requests.fetch_add(1, Ordering::Relaxed);
        let guard = InFlight(requests.clone());
        let app = app.clone();
        async move {
            let response = app.oneshot(request.map(Body::new)).await;
            drop(guard);
            response
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let connection = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(connection);
    let check_every =
        (limits.idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
    let mut idle_check = tokio::time::interval(check_every);
    // hyper's header timeout starts with a request's first byte; a connection that never
    // sends one would be held for the whole idle timeout (a minute by default), and enough of
    // them deny service. So the first request's headers are due `header_read_timeout` after
    // the connection began (after the TLS handshake, which has its own deadline).
    let first_request = tokio::time::sleep(limits.header_read_timeout);
    tokio::pin!(first_request);
    let mut awaiting_first_request = true;
    let mut closing = false;
    loop {
        tokio::select! {
            _ = connection.as_mut() => break,
            _ = &mut first_request, if awaiting_first_request => {
                awaiting_first_request = false;
                if activity.requests.load(Ordering::Relaxed) == 0 {
                    tracing::debug!(timeout = ?limits.header_read_timeout,
                        "no request within the header-read timeout of connecting; closed");
                    break;
                }
            }
            _ = shutdown.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = idle_check.tick() => {
                if activity.in_flight.load(Ordering::Relaxed) == 0
                    && activity.idle_for() >= limits.idle_timeout
                {
                    // Nothing in flight: dropping the connection closes the socket.
                    break;
                }
            }
        }
    }
}

/// A TCP stream that records when bytes last moved.
struct Tracked {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
