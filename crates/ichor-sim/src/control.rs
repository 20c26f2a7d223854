//! Run-time controls of a node's API: partition, slowness and gates, applied to every call
//! before it reaches a handler (a partition from clients only acts on the connections instead,
//! [`crate::cut`]); and forwarding of calls that name another node with the
//! `node` metadata key (talos-facts §2 "Routing to nodes").

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tonic::body::Body;
use tonic::service::Routes;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::network::{Shared, network};

/// A gate on one RPC: calls to it wait until the gate opens.
#[derive(Debug)]
struct GateState {
    open: watch::Sender<bool>,
    arrived: AtomicUsize,
    arrivals: Notify,
}

/// A gate a test holds on a named RPC of one node (e.g. `Bootstrap`, `EtcdLeaveCluster`):
/// every call to it waits until [`Gate::release`], so a test can act at a precise point.
/// Dropping the gate releases it too.
#[derive(Debug)]
pub struct Gate {
    method: String,
    state: Arc<GateState>,
    shared: Arc<Shared>,
    reply: bool,
}

impl Gate {
    /// Waits until `n` calls in total have reached the gate.
    pub async fn arrived(&self, n: usize) {
        loop {
            let notified = self.state.arrivals.notified();
            if self.state.arrived.load(Ordering::SeqCst) >= n {
                return;
            }
            notified.await;
        }
    }

    /// How many calls have reached the gate.
    pub fn count(&self) -> usize {
        self.state.arrived.load(Ordering::SeqCst)
    }

    /// Lets the held calls (and later ones) through.
    pub fn release(self) {}
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.state.open.send_replace(true);
        let gates = if self.reply {
            &self.shared.controls.reply_gates
        } else {
            &self.shared.controls.gates
        };
        if let Ok(mut gates) = gates.lock()
            && gates
                .get(&self.method)
                .is_some_and(|g| Arc::ptr_eq(g, &self.state))
        {
            gates.remove(&self.method);
        }
    }
}

/// The controls of one node.
#[derive(Debug, Default)]
pub(crate) struct Controls {
    partitioned: AtomicBool,
    healed: Notify,
    /// Whether the node is cut off from clients outside the simulated network
    /// ([`crate::Fault::PartitionFromClients`]); its connections watch it.
    cut_off: watch::Sender<bool>,
    slow: StdMutex<Duration>,
    /// Per method: the wait before a call is handled, and before each later piece of its reply.
    slow_methods: StdMutex<BTreeMap<String, (Duration, Duration)>>,
    gates: StdMutex<BTreeMap<String, Arc<GateState>>>,
    /// Gates on replies: the call is handled, then its answer waits.
    reply_gates: StdMutex<BTreeMap<String, Arc<GateState>>>,
    /// How many calls each method's handler ran for.
    handled: StdMutex<BTreeMap<String, usize>>,
    /// How many calls arrived, whatever became of them (refused, forwarded, failed).
    received: AtomicUsize,
}

impl Controls {
    pub(crate) fn is_partitioned(&self) -> bool {
        self.partitioned.load(Ordering::SeqCst)
    }

    pub(crate) fn set_partitioned(&self, partitioned: bool) {
        self.partitioned.store(partitioned, Ordering::SeqCst);
        if !partitioned {
            self.healed.notify_waiters();
        }
    }

    /// Cuts the node off from its clients, or heals the cut.
    pub(crate) fn set_cut_off(&self, cut: bool) {
        self.cut_off.send_replace(cut);
    }

    /// What the node's connections watch: whether it is cut off from its clients.
    pub(crate) fn cut_off(&self) -> watch::Receiver<bool> {
        self.cut_off.subscribe()
    }

    pub(crate) fn set_slow(&self, delay: Duration) {
        if let Ok(mut slow) = self.slow.lock() {
            *slow = delay;
        }
    }

    /// Makes calls to `method` wait `before` they are handled, and their replies `between`
    /// pieces; both zero ends it.
    pub(crate) fn set_slow_method(&self, method: &str, before: Duration, between: Duration) {
        if let Ok(mut slow) = self.slow_methods.lock() {
            if before.is_zero() && between.is_zero() {
                slow.remove(method);
            } else {
                slow.insert(method.to_owned(), (before, between));
            }
        }
    }

    /// The waits of `method`: before it is handled, and between pieces of its reply.
    fn slow_method(&self, method: &str) -> (Duration, Duration) {
        self.slow_methods
            .lock()
            .ok()
            .and_then(|slow| slow.get(method).copied())
            .unwrap_or_default()
    }

    /// Holds calls to `method` until the returned gate is released.
    pub(crate) fn gate(shared: &Arc<Shared>, method: &str) -> Gate {
        Self::new_gate(shared, method, false)
    }

    /// Lets calls to `method` run, then holds their replies until the gate is released: the
    /// node has acted, the caller does not know yet.
    pub(crate) fn gate_reply(shared: &Arc<Shared>, method: &str) -> Gate {
        Self::new_gate(shared, method, true)
    }

    fn new_gate(shared: &Arc<Shared>, method: &str, reply: bool) -> Gate {
        let (open, _) = watch::channel(false);
        let state = Arc::new(GateState {
            open,
            arrived: AtomicUsize::new(0),
            arrivals: Notify::new(),
        });
        let gates = if reply {
            &shared.controls.reply_gates
        } else {
            &shared.controls.gates
        };
        if let Ok(mut gates) = gates.lock() {
            gates.insert(method.to_owned(), Arc::clone(&state));
        }
        Gate {
            method: method.to_owned(),
            state,
            shared: Arc::clone(shared),
            reply,
        }
    }

    /// What happens to a call before its handler runs: a partitioned node never answers
    /// (until healed), a slow one answers late, a gated method waits for its gate.
    async fn enter(&self, method: &str) {
        loop {
            let healed = self.healed.notified();
            if !self.is_partitioned() {
                break;
            }
            healed.await;
        }
        let delay = self.slow.lock().map(|d| *d).unwrap_or_default() + self.slow_method(method).0;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Self::pass(&self.gates, method).await;
    }

    /// Waits at the gate on `method` in `gates`, if there is one.
    async fn pass(gates: &StdMutex<BTreeMap<String, Arc<GateState>>>, method: &str) {
        let gate = gates.lock().ok().and_then(|g| g.get(method).cloned());
        if let Some(gate) = gate {
            gate.arrived.fetch_add(1, Ordering::SeqCst);
            gate.arrivals.notify_waiters();
            let mut open = gate.open.subscribe();
            let _ = open.wait_for(|open| *open).await;
        }
    }

    /// Whether a gate holds `what` now: something the node does by itself rather than a call
    /// it answers (e.g. [`crate::PROMOTION`]), which skips it while held. The first time a
    /// gate holds it, one arrival is counted, so a test can wait until the node got there.
    pub(crate) fn holds(&self, what: &str) -> bool {
        let gate = self.gates.lock().ok().and_then(|g| g.get(what).cloned());
        match gate {
            Some(gate) if !*gate.open.borrow() => {
                if gate
                    .arrived
                    .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    gate.arrivals.notify_waiters();
                }
                true
            }
            _ => false,
        }
    }

    /// How many calls arrived at this node, whatever became of them.
    pub(crate) fn received(&self) -> usize {
        self.received.load(Ordering::Relaxed)
    }

    /// How many calls `method`'s handler ran for.
    pub(crate) fn handled(&self, method: &str) -> usize {
        self.handled
            .lock()
            .map(|h| h.get(method).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// What happens to a reply before it leaves: it is counted, and a reply gate holds it.
    async fn leave(&self, method: &str) {
        if let Ok(mut handled) = self.handled.lock() {
            *handled.entry(method.to_owned()).or_default() += 1;
        }
        Self::pass(&self.reply_gates, method).await;
    }
}

/// A node's API with its controls in front: what the node's server serves, and what another
/// node calls when it forwards a request here.
#[derive(Clone)]
pub(crate) struct Controlled {
    pub(crate) routes: Routes,
    pub(crate) shared: Arc<Shared>,
    /// Whether this node forwards calls naming other nodes (configured nodes do; maintenance
    /// mode refuses with `PermissionDenied "no request forwarding"`, talos-facts §2).
    pub(crate) forwarding: bool,
    /// Names this node answers to as a forwarding target: its IP and hostname.
    pub(crate) names: Arc<Vec<String>>,
}

impl std::fmt::Debug for Controlled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controlled")
            .field("addr", &self.shared.addr)
            .finish_non_exhaustive()
    }
}

type Reply = http::Response<Body>;

/// Where a call goes: this node, or the node its `node` metadata names.
enum Route {
    Local,
    Forward(Box<Controlled>),
    Refuse(tonic::Status),
}

impl Controlled {
    fn route(&self, request: &http::Request<Body>) -> Route {
        let targets: Vec<&str> = request
            .headers()
            .get_all("node")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let target = match targets.as_slice() {
            [] => return Route::Local,
            [one] => *one,
            _ => {
                return Route::Refuse(tonic::Status::invalid_argument(
                    "the node metadata key takes one value",
                ));
            }
        };
        if self.names.iter().any(|n| n == target) {
            return Route::Local;
        }
        if !self.forwarding || request.headers().contains_key("proxyfrom") {
            return Route::Refuse(tonic::Status::permission_denied("no request forwarding"));
        }
        let net = network();
        // apid dials <target>:50000 with its node certificate: the target must trust this
        // node's OS CA (talos-facts §2 "Routing to nodes").
        let own_ca = net
            .nodes
            .get(&self.shared.addr)
            .and_then(|e| e.config.as_ref())
            .map(|c| c.os_ca_crt.clone());
        match net.by_target(target) {
            Some(entry)
                if entry.config.as_ref().map(|c| c.os_ca_crt.clone()) == own_ca
                    && entry.forward.is_some() =>
            {
                Route::Forward(Box::new(entry.forward.clone().expect("checked")))
            }
            Some(_) => Route::Refuse(tonic::Status::unavailable(format!(
                "connection error: {target}:50000 does not trust this node's certificate"
            ))),
            None => Route::Refuse(tonic::Status::unavailable(format!(
                "connection error: dial tcp {target}:50000: connection refused"
            ))),
        }
    }
}

/// tonic answers a path no service of ours routes (or a method a served service lacks) with a
/// bare `Unimplemented`; the simulator says which method it is and that it is not simulated
/// (talos-facts §10.10).
fn name_unimplemented(path: &str, reply: Reply) -> Reply {
    let headers = reply.headers();
    let unimplemented = headers
        .get("grpc-status")
        .is_some_and(|s| s.as_bytes() == b"12");
    let unnamed = headers
        .get("grpc-message")
        .is_none_or(|m| m.as_bytes().is_empty());
    if unimplemented && unnamed {
        crate::not_simulated_method(path).into_http()
    } else {
        reply
    }
}

impl tower::Service<http::Request<Body>> for Controlled {
    type Response = Reply;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Reply, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let method = request
                .uri()
                .path()
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            this.shared
                .controls
                .received
                .fetch_add(1, Ordering::Relaxed);
            this.shared.controls.enter(&method).await;
            match this.route(&request) {
                Route::Local => {
                    let path = request.uri().path().to_owned();
                    // Roles first, as machined's interceptor checks them (talos-facts §10.6).
                    let certs = request
                        .extensions()
                        .get::<TlsConnectInfo<TcpConnectInfo>>()
                        .and_then(TlsConnectInfo::peer_certs);
                    let roles = crate::authz::caller_roles(!this.forwarding, certs.as_ref());
                    if let Err(status) = crate::authz::check(&path, &roles) {
                        return Ok(status.into_http());
                    }
                    let mut routes = this.routes.clone();
                    let reply = tower::Service::call(&mut routes, request).await;
                    this.shared.controls.leave(&method).await;
                    let between = this.shared.controls.slow_method(&method).1;
                    reply.map(|reply| {
                        let reply = name_unimplemented(&path, reply);
                        if between.is_zero() {
                            reply
                        } else {
                            reply.map(|body| Body::new(Paced::new(body, between)))
                        }
                    })
                }
                Route::Forward(mut target) => {
                    // The target answers as itself, with the caller's roles (impersonation)
                    // and never forwards again (talos-facts §2).
                    request.headers_mut().remove("node");
                    request.headers_mut().insert(
                        "proxyfrom",
                        http::HeaderValue::from_str(&this.shared.addr.ip().to_string())
                            .unwrap_or_else(|_| http::HeaderValue::from_static("unknown")),
                    );
                    tower::Service::call(&mut *target, request).await
                }
                Route::Refuse(status) => Ok(status.into_http()),
            }
        })
    }
}

/// A reply body that waits before each piece after the first ([`crate::Fault::SlowMethod`]).
struct Paced {
    inner: Body,
    between: Duration,
    /// Whether a data frame has gone out: every later piece waits.
    started: bool,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Paced {
    fn new(inner: Body, between: Duration) -> Self {
        Self {
            inner,
            between,
            started: false,
            wait: None,
        }
    }
}

impl http_body::Body for Paced {
    type Data = tonic::codegen::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.started {
            let between = this.between;
            let wait = this
                .wait
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(between)));
            if wait.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &frame {
            this.wait = None;
            this.started |= frame.is_data();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}
