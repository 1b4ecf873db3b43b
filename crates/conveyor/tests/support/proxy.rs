//! A TCP proxy for fault tests: it sits on one link of a real deployment and misbehaves on
//! command. It can add latency, stop forwarding (holding the bytes, or dropping them, in both
//! directions or only the answers), cut every connection it carries (with a TCP reset, as a dead
//! peer or a firewall would) and refuse new ones (accept, then reset), and it can arm a trigger
//! that starts holding everything the moment a given byte sequence crosses it, so a fault lands
//! at a chosen point of a request.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward (after the configured delay).
    Forward,
    /// Stop forwarding and keep the bytes: delivered on resume, as TCP would after a partition.
    Hold,
    /// Stop forwarding and throw the bytes away.
    Blackhole,
    /// Forward requests, throw the answers away: a one-way partition, where the far side hears
    /// and acts but nothing it says comes back.
    DropAnswers,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Client to upstream.
    Up,
    /// Upstream to client.
    Down,
}

/// Hold everything once `stages` have crossed one connection upstream, in order.
struct Trigger {
    generation: u64,
    stages: Vec<Vec<u8>>,
    /// Whether the chunk completing the last stage is still delivered (the fault then falls
    /// just after it) or held with everything else (just before it).
    forward_matching: bool,
}

struct Shared {
    upstream: SocketAddr,
    mode: watch::Sender<Mode>,
    delay: Mutex<Duration>,
    refuse: AtomicBool,
    trigger: Mutex<Option<Trigger>>,
    generation: AtomicU64,
    triggered: AtomicBool,
    held_up: AtomicUsize,
    held_down: AtomicUsize,
    /// The connection the trigger fired on (its id + 1; 0 before), and its chunks held.
    victim: AtomicU64,
    victim_held_up: AtomicUsize,
    victim_held_down: AtomicUsize,
    connections: Mutex<HashMap<u64, CancellationToken>>,
    next_id: AtomicU64,
    refused: AtomicUsize,
}

pub struct Proxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            upstream,
            mode: watch::Sender::new(Mode::Forward),
            delay: Mutex::new(Duration::ZERO),
            refuse: AtomicBool::new(false),
            trigger: Mutex::new(None),
            generation: AtomicU64::new(0),
            triggered: AtomicBool::new(false),
            held_up: AtomicUsize::new(0),
            held_down: AtomicUsize::new(0),
            victim: AtomicU64::new(0),
            victim_held_up: AtomicUsize::new(0),
            victim_held_down: AtomicUsize::new(0),
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            refused: AtomicUsize::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Proxy {
            addr,
            shared,
            accept,
        }
    }

    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
    }

    pub fn set_delay(&self, delay: Duration) {
        *self.shared.delay.lock().unwrap() = delay;
    }

    /// Forwarding again: held bytes go on, in order.
    pub fn resume(&self) {
        self.set_mode(Mode::Forward);
    }

    pub fn refuse(&self, refuse: bool) {
        self.shared.refuse.store(refuse, Ordering::SeqCst);
    }

    /// Resets every connection the proxy carries; returns how many.
    pub fn cut(&self) -> usize {
        let connections: Vec<CancellationToken> = self
            .shared
            .connections
            .lock()
            .unwrap()
            .drain()
            .map(|(_, cut)| cut)
            .collect();
        for cut in &connections {
            cut.cancel();
        }
        connections.len()
    }

    /// Arms a trigger: the first connection on which `stages` go upstream, in order, switches
    /// the whole proxy to [`Mode::Hold`].
    pub fn hold_when(&self, stages: &[&[u8]], forward_matching: bool) {
        let generation = self.shared.generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.shared.triggered.store(false, Ordering::SeqCst);
        self.shared.victim.store(0, Ordering::SeqCst);
        *self.shared.trigger.lock().unwrap() = Some(Trigger {
            generation,
            stages: stages.iter().map(|s| s.to_vec()).collect(),
            forward_matching,
        });
    }

    pub fn triggered(&self) -> bool {
        self.shared.triggered.load(Ordering::SeqCst)
    }

    /// Chunks waiting in the proxy, going upstream and coming back.
    pub fn held(&self) -> (usize, usize) {
        (
            self.shared.held_up.load(Ordering::SeqCst),
            self.shared.held_down.load(Ordering::SeqCst),
        )
    }

    /// The same, on the connection the trigger fired on.
    pub fn victim_held(&self) -> (usize, usize) {
        (
            self.shared.victim_held_up.load(Ordering::SeqCst),
            self.shared.victim_held_down.load(Ordering::SeqCst),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if shared.refuse.load(Ordering::SeqCst) {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            let _ = client.set_zero_linger();
            drop(client);
            continue;
        }
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        let cut = CancellationToken::new();
        shared.connections.lock().unwrap().insert(id, cut.clone());
        tokio::spawn(carry(shared.clone(), id, client, cut));
    }
}

/// One proxied connection, until either side closes it or the proxy cuts it.
async fn carry(shared: Arc<Shared>, id: u64, client: TcpStream, cut: CancellationToken) {
    let upstream = tokio::select! {
        connected = TcpStream::connect(shared.upstream) => connected,
        _ = cut.cancelled() => return,
    };
    let Ok(upstream) = upstream else {
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    let finished = {
        let both = async {
            tokio::join!(
                pump(&mut client_read, &mut upstream_write, Dir::Up, &shared, id),
                pump(
                    &mut upstream_read,
                    &mut client_write,
                    Dir::Down,
                    &shared,
                    id
                ),
            )
        };
        tokio::select! {
            _ = both => true,
            _ = cut.cancelled() => false,
        }
    };
    if !finished {
        // An abortive close: both peers see a reset, as with a dead host or a firewall.
        let _ = client_read.as_ref().set_zero_linger();
        let _ = upstream_read.as_ref().set_zero_linger();
    }
    shared.connections.lock().unwrap().remove(&id);
}

/// Counts a held chunk for as long as it waits (also when the connection is cut meanwhile).
struct HeldGuard<'a>(&'a AtomicUsize);

impl<'a> HeldGuard<'a> {
    fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        HeldGuard(counter)
    }
}

impl Drop for HeldGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

impl Shared {
    /// Advances this connection's progress through the armed trigger; `Some(forward_matching)`
    /// when the chunk completes it (the trigger then fires, once).
    fn fire(&self, id: u64, chunk: &[u8], progress: &mut (u64, usize)) -> Option<bool> {
        let mut slot = self.trigger.lock().unwrap();
        let trigger = slot.as_ref()?;
        if progress.0 != trigger.generation {
            *progress = (trigger.generation, 0);
        }
        while progress.1 < trigger.stages.len() && contains(chunk, &trigger.stages[progress.1]) {
            progress.1 += 1;
        }
        if progress.1 < trigger.stages.len() {
            return None;
        }
        let forward_matching = trigger.forward_matching;
        *slot = None;
        self.victim.store(id + 1, Ordering::SeqCst);
        self.mode.send_replace(Mode::Hold);
        self.triggered.store(true, Ordering::SeqCst);
        Some(forward_matching)
    }
}

async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    dir: Dir,
    shared: &Shared,
    id: u64,
) {
    let mut mode = shared.mode.subscribe();
    let mut buf = vec![0u8; 64 * 1024];
    let mut progress = (0, 0);
    let (held, victim_held) = match dir {
        Dir::Up => (&shared.held_up, &shared.victim_held_up),
        Dir::Down => (&shared.held_down, &shared.victim_held_down),
    };
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        if dir == Dir::Up && shared.fire(id, chunk, &mut progress) == Some(true) {
            // The fault falls just after this chunk: it goes on, everything after it waits.
            if to.write_all(chunk).await.is_err() {
                return;
            }
            continue;
        }
        loop {
            let current = *mode.borrow_and_update();
            match current {
                Mode::Forward => {
                    let delay = *shared.delay.lock().unwrap();
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    if to.write_all(chunk).await.is_err() {
                        return;
                    }
                    break;
                }
                Mode::Blackhole => break,
                Mode::DropAnswers if dir == Dir::Down => break,
                Mode::DropAnswers => {
                    if to.write_all(chunk).await.is_err() {
                        return;
                    }
                    break;
                }
                Mode::Hold => {
                    let _held = HeldGuard::new(held);
                    let _victim = (shared.victim.load(Ordering::SeqCst) == id + 1)
                        .then(|| HeldGuard::new(victim_held));
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    }
    let _ = to.shutdown().await;
}
