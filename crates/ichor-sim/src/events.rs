//! The machine event stream: what `MachineService.Events` serves (talos-facts §10.1–§10.3).
//!
//! Each boot of a node has one [`EventLog`], as each start of machined has one in-memory
//! ring of events: a reboot starts an empty one, and event ids (xids) keep growing across
//! reboots, so a client resuming after a reboot with the last id it saw gets the new boot's
//! events from the start. What publishes into the log (sequences, services, machine status)
//! lives in `sequences.rs` and `services.rs`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex as StdMutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ichor_talos::api::machine::{
    Event, EventsRequest, MachineStatusEvent, PhaseEvent, RestartEvent, SequenceEvent,
    ServiceStateEvent, TaskEvent,
};
use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt as _;
use tonic::Status;

/// How many events machined's ring holds, and the safety gap kept between the oldest event a
/// watcher may start from and the writer (talos-facts §10.2): 990 past events are available.
const CAPACITY: u64 = 1000;
const GAP: u64 = 10;

/// How long a watcher may take to send what was published before its node went down.
const DRAIN: Duration = Duration::from_secs(2);

/// A 12-byte xid: 4 bytes of Unix seconds, 3 of machine id, 2 of process id, 3 of a counter;
/// compared bytewise, written as 20 characters of lowercase base32hex (talos-facts §10.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Xid([u8; 12]);

const XID_ALPHABET: &[u8; 32] = b"0123456789abcdefghijklmnopqrstuv";

/// The machine id and process id of this simulator, and the counter all its ids share, so
/// ids made in the same second still grow (across a simulated node's reboots too).
static XID_SOURCE: LazyLock<([u8; 3], [u8; 2], AtomicU32)> = LazyLock::new(|| {
    let machine: [u8; 3] = rand::random();
    let pid = u16::try_from(std::process::id() & 0xffff)
        .unwrap_or_default()
        .to_be_bytes();
    (
        machine,
        pid,
        AtomicU32::new(rand::random::<u32>() & 0x00ff_ffff),
    )
});

impl Xid {
    /// A new id for now.
    pub(crate) fn new() -> Self {
        let seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
            .unwrap_or_default();
        let (machine, pid, counter) = &*XID_SOURCE;
        let count = counter.fetch_add(1, Ordering::SeqCst).to_be_bytes();
        let mut id = [0u8; 12];
        id[..4].copy_from_slice(&seconds.to_be_bytes());
        id[4..7].copy_from_slice(machine);
        id[7..9].copy_from_slice(pid);
        id[9..].copy_from_slice(&count[1..]);
        Self(id)
    }

    /// The id's time (whole seconds).
    fn time(self) -> SystemTime {
        let seconds = u32::from_be_bytes([self.0[0], self.0[1], self.0[2], self.0[3]]);
        UNIX_EPOCH + Duration::from_secs(u64::from(seconds))
    }

    /// Parses the 20-character form; `None` for anything else.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let bytes = text.as_bytes();
        if bytes.len() != 20 {
            return None;
        }
        let mut bits: u128 = 0;
        for &c in bytes {
            let value = XID_ALPHABET.iter().position(|&a| a == c)?;
            bits = (bits << 5) | u128::try_from(value).ok()?;
        }
        // 100 bits were read: the 96 of the id and 4 of padding, which must be zero.
        if bits & 0xf != 0 {
            return None;
        }
        let bits = bits >> 4;
        let mut id = [0u8; 12];
        for (i, byte) in id.iter_mut().enumerate() {
            *byte = u8::try_from((bits >> (8 * (11 - i))) & 0xff).ok()?;
        }
        Some(Self(id))
    }
}

impl std::fmt::Display for Xid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut bits: u128 = 0;
        for &b in &self.0 {
            bits = (bits << 8) | u128::from(b);
        }
        bits <<= 4;
        let mut out = String::with_capacity(20);
        for i in (0..20).rev() {
            let index = usize::try_from((bits >> (5 * i)) & 0x1f).unwrap_or_default();
            out.push(char::from(XID_ALPHABET[index]));
        }
        f.write_str(&out)
    }
}

/// What an event carries: one of the payloads talosctl decodes, each sent with the type URL
/// `talos/runtime/<full message name>` (talos-facts §10.1).
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    Sequence(SequenceEvent),
    Phase(PhaseEvent),
    Task(TaskEvent),
    Service(ServiceStateEvent),
    Restart(RestartEvent),
    MachineStatus(MachineStatusEvent),
}

impl Payload {
    fn type_url(&self) -> &'static str {
        match self {
            Self::Sequence(_) => "talos/runtime/machine.SequenceEvent",
            Self::Phase(_) => "talos/runtime/machine.PhaseEvent",
            Self::Task(_) => "talos/runtime/machine.TaskEvent",
            Self::Service(_) => "talos/runtime/machine.ServiceStateEvent",
            Self::Restart(_) => "talos/runtime/machine.RestartEvent",
            Self::MachineStatus(_) => "talos/runtime/machine.MachineStatusEvent",
        }
    }

    fn encode(&self) -> Vec<u8> {
        match self {
            Self::Sequence(m) => m.encode_to_vec(),
            Self::Phase(m) => m.encode_to_vec(),
            Self::Task(m) => m.encode_to_vec(),
            Self::Service(m) => m.encode_to_vec(),
            Self::Restart(m) => m.encode_to_vec(),
            Self::MachineStatus(m) => m.encode_to_vec(),
        }
    }
}

/// One published event.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    pub(crate) id: Xid,
    pub(crate) actor: String,
    pub(crate) payload: Payload,
}

impl Published {
    fn to_proto(&self) -> Event {
        Event {
            metadata: None,
            data: Some(prost_types::Any {
                type_url: self.payload.type_url().into(),
                value: self.payload.encode(),
            }),
            id: self.id.to_string(),
            actor_id: self.actor.clone(),
        }
    }
}

#[derive(Debug, Default)]
struct Ring {
    events: VecDeque<Published>,
    /// The absolute position of the next event written.
    write_pos: u64,
}

impl Ring {
    /// The oldest position a watcher may start from.
    fn min_pos(&self) -> u64 {
        self.write_pos.saturating_sub(CAPACITY - GAP)
    }

    fn get(&self, pos: u64) -> Option<&Published> {
        let first = self.write_pos - self.events.len() as u64;
        pos.checked_sub(first)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.events.get(i))
    }
}

/// Where a watcher starts (talos-facts §10.2): at most one of the tail options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// Only events published from now on.
    Now,
    /// This many past events (`-1`: every one still held).
    Tail(i32),
    /// Events with an id greater than this one.
    After(Xid),
    /// Events whose id's time is after now minus this.
    Since(Duration),
}

impl Start {
    /// The start an `EventsRequest` asks for, refused as machined refuses it: a `tail_id` that
    /// is not an xid, or two tail options at once (plain errors, code Unknown).
    pub(crate) fn of(request: &EventsRequest) -> Result<Self, Status> {
        let mut start = Self::Now;
        if request.tail_events != 0 {
            start = Self::Tail(request.tail_events);
        }
        if !request.tail_id.is_empty() {
            let id = Xid::parse(&request.tail_id)
                .ok_or_else(|| Status::unknown("error parsing tail_id: xid: invalid ID"))?;
            if start != Self::Now {
                return Err(Status::unknown(
                    "WithTailID can't be specified at the same time with WithTailEvents or WithTailDuration",
                ));
            }
            start = Self::After(id);
        }
        if request.tail_seconds != 0 {
            if start != Self::Now {
                return Err(Status::unknown(
                    "WithTailDuration can't be specified at the same time with WithTailEvents or WithTailID",
                ));
            }
            start = Self::Since(Duration::from_secs(u64::from(
                request.tail_seconds.unsigned_abs(),
            )));
        }
        Ok(start)
    }
}

/// One boot's event log.
#[derive(Debug)]
pub(crate) struct EventLog {
    ring: StdMutex<Ring>,
    /// The write position, for watchers waiting for the next event.
    written: watch::Sender<u64>,
    /// Set when the node's API goes away, to the write position then: every watcher sends
    /// what was published before (as a real node's stream carries what it sent before the
    /// machine went down) and ends.
    closed_at: watch::Sender<Option<u64>>,
}

impl Default for EventLog {
    fn default() -> Self {
        Self {
            ring: StdMutex::new(Ring::default()),
            written: watch::channel(0).0,
            closed_at: watch::channel(None).0,
        }
    }
}

impl EventLog {
    /// Publishes an event by `actor` (empty for the node's own work) and returns it.
    pub(crate) fn publish(&self, actor: &str, payload: Payload) -> Published {
        let event = Published {
            id: Xid::new(),
            actor: actor.to_owned(),
            payload,
        };
        let pos = {
            let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
            ring.events.push_back(event.clone());
            while ring.events.len() as u64 > CAPACITY {
                ring.events.pop_front();
            }
            ring.write_pos += 1;
            ring.write_pos
        };
        self.written.send_replace(pos);
        event
    }

    /// Ends every watcher once it has sent what was published so far (their streams finish,
    /// as machined's do when it stops); the log keeps its events.
    pub(crate) fn disconnect(&self) {
        let end = self
            .ring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_pos;
        self.closed_at.send_replace(Some(end));
    }

    /// Serves watchers again after a disconnect: the node's API came back within the same
    /// boot (a config applied in maintenance mode takes over without a reboot).
    pub(crate) fn reopen(&self) {
        self.closed_at.send_replace(None);
    }

    /// The position a watcher starting at `start` reads first (machined's `Watch`).
    fn start_pos(&self, start: Start) -> u64 {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let min = ring.min_pos();
        let first_where = |pred: &dyn Fn(&Published) -> bool| {
            (min..ring.write_pos)
                .find(|&p| ring.get(p).is_some_and(pred))
                .unwrap_or(ring.write_pos)
        };
        match start {
            Start::Now => ring.write_pos,
            Start::Tail(n) if n < 0 => min,
            Start::Tail(n) => ring
                .write_pos
                .saturating_sub(u64::from(n.unsigned_abs()))
                .max(min),
            Start::After(id) => first_where(&|e| e.id > id),
            Start::Since(duration) => {
                let since = SystemTime::now()
                    .checked_sub(duration)
                    .unwrap_or(UNIX_EPOCH);
                first_where(&|e| e.id.time() > since)
            }
        }
    }

    /// The events from `start` on, filtered by actor when one is given, until the log is
    /// disconnected or the reader goes away.
    pub(crate) fn watch(
        self: &Arc<Self>,
        start: Start,
        actor: Option<String>,
    ) -> mpsc::Receiver<Published> {
        let mut pos = self.start_pos(start);
        let (tx, rx) = mpsc::channel(16);
        let log = Arc::clone(self);
        let mut written = self.written.subscribe();
        let mut closed = self.closed_at.subscribe();
        tokio::spawn(async move {
            // A reader that does not drain after the disconnect is cut off.
            let mut deadline: Option<tokio::time::Instant> = None;
            loop {
                let end = *closed.borrow_and_update();
                if end.is_some() && deadline.is_none() {
                    deadline = Some(tokio::time::Instant::now() + DRAIN);
                }
                if end.is_some_and(|end| pos >= end) {
                    return;
                }
                let next = {
                    let ring = log.ring.lock().unwrap_or_else(|e| e.into_inner());
                    if ring.write_pos.saturating_sub(pos) >= CAPACITY {
                        // Overrun: machined's watcher gives up.
                        return;
                    }
                    ring.get(pos).cloned()
                };
                let cutoff = async {
                    match deadline {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                let Some(event) = next else {
                    tokio::select! {
                        changed = written.changed() => if changed.is_err() { return },
                        _ = closed.changed() => {},
                        () = tx.closed() => return,
                    }
                    continue;
                };
                pos += 1;
                if actor.as_ref().is_some_and(|a| *a != event.actor) {
                    continue;
                }
                tokio::select! {
                    sent = tx.send(event) => if sent.is_err() { return },
                    () = cutoff => return,
                }
            }
        });
        rx
    }
}

/// The stream the Events RPC answers with.
pub(crate) type EventStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<Event, Status>> + Send>>;

/// `MachineService.Events` (talos-facts §10.2): first an empty "hello" event (no type URL,
/// the requested actor id), then the log from the requested start, filtered by actor; a bad
/// request gets its error after the hello, as from machined.
pub(crate) fn serve(log: &Arc<EventLog>, request: &EventsRequest) -> EventStream {
    let hello = Event {
        metadata: None,
        data: Some(prost_types::Any::default()),
        id: Xid::new().to_string(),
        actor_id: request.with_actor_id.clone(),
    };
    let first = tokio_stream::once(Ok(hello));
    match Start::of(request) {
        Err(status) => Box::pin(first.chain(tokio_stream::once(Err(status)))),
        Ok(start) => {
            let actor = (!request.with_actor_id.is_empty()).then(|| request.with_actor_id.clone());
            let events = tokio_stream::wrappers::ReceiverStream::new(log.watch(start, actor))
                .map(|e| Ok(e.to_proto()));
            Box::pin(first.chain(events))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_talos::api::machine::task_event::Action;

    fn task(name: &str) -> Payload {
        Payload::Task(TaskEvent {
            task: name.into(),
            action: Action::Start as i32,
        })
    }

    fn names(rx: &mut mpsc::Receiver<Published>, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| match rx.try_recv().expect("an event").payload {
                Payload::Task(t) => t.task,
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn xids_round_trip_and_grow() {
        let a = Xid::new();
        let b = Xid::new();
        assert!(b > a, "ids made later compare greater");
        assert_eq!(a.to_string().len(), 20);
        assert_eq!(Xid::parse(&a.to_string()), Some(a));
        assert_eq!(Xid::parse("not-an-xid"), None);
        // The example id from rs/xid's documentation decodes to its timestamp.
        let known = Xid::parse("9m4e2mr0ui3e8a215n4g").expect("xid");
        assert_eq!(
            known
                .time()
                .duration_since(UNIX_EPOCH)
                .expect("time")
                .as_secs(),
            1_300_816_219
        );
        assert_eq!(known.to_string(), "9m4e2mr0ui3e8a215n4g");
        // Checked against rs/xid v1.6.0: these bytes encode so, and a set padding bit is refused.
        let raw = Xid([1, 2, 3, 4, 0xaa, 0xbb, 0xcc, 0x12, 0x34, 0xfe, 0xdc, 0xba]);
        assert_eq!(raw.to_string(), "0410615anf614d7urit0");
        assert_eq!(Xid::parse("9m4e2mr0ui3e8a215n4h"), None);
    }

    #[tokio::test]
    async fn tail_options_pick_the_start_as_machined_does() {
        let log = Arc::new(EventLog::default());
        let first = log.publish("", task("a"));
        log.publish("actor", task("b"));
        log.publish("", task("c"));

        let mut all = log.watch(Start::Tail(-1), None);
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(names(&mut all, 3), ["a", "b", "c"]);

        let mut two = log.watch(Start::Tail(2), None);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(names(&mut two, 2), ["b", "c"]);

        let mut after = log.watch(Start::After(first.id), None);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(names(&mut after, 2), ["b", "c"]);

        let mut mine = log.watch(Start::Tail(-1), Some("actor".into()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(names(&mut mine, 1), ["b"]);
        assert!(mine.try_recv().is_err(), "other actors are filtered out");

        let mut now = log.watch(Start::Now, None);
        log.publish("", task("d"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(names(&mut now, 1), ["d"]);

        log.publish("", task("e"));
        log.disconnect();
        log.publish("", task("after"));
        let last = now
            .recv()
            .await
            .expect("what was published before the disconnect");
        assert!(matches!(last.payload, Payload::Task(ref t) if t.task == "e"));
        assert!(
            now.recv().await.is_none(),
            "a disconnect ends the watchers after that"
        );
    }

    #[test]
    fn conflicting_tails_and_bad_ids_are_refused() {
        let both = EventsRequest {
            tail_events: 1,
            tail_id: Xid::new().to_string(),
            ..Default::default()
        };
        assert!(Start::of(&both).is_err());
        let bad = EventsRequest {
            tail_id: "zzz".into(),
            ..Default::default()
        };
        let err = Start::of(&bad).expect_err("not an xid");
        assert!(err.message().starts_with("error parsing tail_id"), "{err}");
        assert_eq!(Start::of(&EventsRequest::default()).ok(), Some(Start::Now));
    }

    #[test]
    fn the_ring_keeps_990_past_events() {
        let log = EventLog::default();
        for i in 0..1500 {
            log.publish("", task(&i.to_string()));
        }
        assert_eq!(log.start_pos(Start::Tail(-1)), 1500 - 990);
    }
}
