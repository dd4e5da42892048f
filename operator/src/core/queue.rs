//! The queue in front of kube's controller machinery. kube's scheduler keeps every request it is
//! handed three times over (a map, a delay queue and, once due, a pending set), each a reference
//! of four strings, and its tables keep their largest size: the 10,000 PVCs of a first list
//! cost some megabytes for the life of the process. Here a request waits as one short string, in
//! order, once however often it is asked for, and kube is handed requests for at most `limit`
//! objects whose pass has not ended yet; the queue's own tables are given back when it empties.
//!
//! A pass that asks for another later (`core::action::Action::requeue`, and a failed pass's retry)
//! waits here too, not in kube's scheduler: kube is told to wait for a change, and the key comes
//! back into the queue when it is due. As in kube, a request for an object that waits for a later
//! pass runs now, and that later pass with it.
//!
//! Every request handed to kube ends in a pass result (a pass, a failed pass, or "not in the
//! store" for an object gone meanwhile), and a key is never handed again while its pass is out
//! (asked for meanwhile, it goes first once that pass ends). So each handed key comes back
//! through `Front::passed` once, and the count of handed keys cannot stay full for good.
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::future::Future as _;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::stream::{BoxStream, SelectAll};
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::Controller;
use kube::runtime::controller::{Action as KubeAction, Error as ControllerError};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::time::{Instant, Sleep};

use super::action::Action;
use super::slim::{Key, Listing, SlimStore, Slimmable, key};
use crate::primitives::locked;

fn object_ref<K: Resource<DynamicType = ()>>(key: &str) -> ObjectRef<K> {
    match key.split_once('/') {
        Some((namespace, name)) => ObjectRef::new(name).within(namespace),
        None => ObjectRef::new(key),
    }
}

/// Tables at most this long are kept when the queue empties; longer ones are given back.
const KEEP_CAPACITY: usize = 64;

struct Shared {
    waiting: VecDeque<Key>,
    queued: HashSet<Key>,
    /// Handed to kube, pass not ended yet.
    handed: HashSet<Key>,
    /// Taken from the queue while out: queued again, first, when its pass ends.
    again: HashSet<Key>,
    /// For a controller over a slim cache: lends kube the objects it is handed.
    lender: Option<Box<dyn Lender>>,
    /// Keys asked for again later, by when: the earliest time asked per key, and those times in
    /// order (an entry whose time is no longer its key's is left to fall out when due).
    due: HashMap<Key, Instant>,
    later: BinaryHeap<Reverse<(Instant, Key)>>,
    limit: usize,
    waker: Option<Waker>,
    /// controller-runtime's `workqueue_depth` of this controller: the objects waiting here.
    depth: Option<prometheus::IntGauge>,
}

impl Shared {
    fn new() -> Self {
        let (waiting, queued, handed) = (VecDeque::new(), HashSet::new(), HashSet::new());
        let (due, later) = (HashMap::new(), BinaryHeap::new());
        let (again, lender) = (HashSet::new(), None);
        Shared { waiting, queued, handed, again, lender, due, later, limit: 1, waker: None, depth: None }
    }

    fn push(&mut self, key: Key) {
        self.enqueue(key, false);
    }

    /// Queues `key` once, last (or `first`). A pass now stands for any later one it waited for.
    fn enqueue(&mut self, key: Key, first: bool) {
        self.due.remove(&key);
        if self.queued.insert(Arc::clone(&key)) {
            if first {
                self.waiting.push_front(key);
            } else {
                self.waiting.push_back(key);
            }
            self.show_depth();
        }
    }

    fn show_depth(&self) {
        if let Some(depth) = &self.depth {
            depth.set(i64::try_from(self.waiting.len() + self.again.len()).unwrap_or(i64::MAX));
        }
    }

    /// The next key to hand to kube, if fewer than `limit` are out. A key whose pass is out waits
    /// for it to end (kube would hold it meanwhile, and a lent object must stay until then).
    fn pop(&mut self) -> Option<Key> {
        while self.handed.len() < self.limit {
            let key = self.waiting.pop_front()?;
            self.queued.remove(&key);
            if self.handed.contains(&key) {
                self.again.insert(key);
                continue;
            }
            self.show_depth();
            self.handed.insert(Arc::clone(&key));
            if self.waiting.is_empty() && self.waiting.capacity() > KEEP_CAPACITY {
                self.waiting = VecDeque::new();
                self.queued = HashSet::new();
            }
            if let Some(lender) = self.lender.as_mut() {
                lender.lend(&key);
            }
            return Some(key);
        }
        None
    }

    /// `key` back into the queue at `at`, unless it is due sooner already.
    fn push_at(&mut self, key: Key, at: Instant) {
        if self.due.get(&key).is_some_and(|due| *due <= at) {
            return;
        }
        self.due.insert(Arc::clone(&key), at);
        self.later.push(Reverse((at, key)));
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    /// Queues the keys due by `now`; returns when the next one is.
    fn release_due(&mut self, now: Instant) -> Option<Instant> {
        while let Some(Reverse((at, _))) = self.later.peek() {
            if *at > now {
                return Some(*at);
            }
            let Some(Reverse((at, key))) = self.later.pop() else { break };
            if self.due.get(&key) == Some(&at) {
                self.push(key);
            }
        }
        if self.due.is_empty() && self.due.capacity() > KEEP_CAPACITY {
            self.due = HashMap::new();
            self.later = BinaryHeap::new();
        }
        None
    }

    fn passed(&mut self, key: &str) {
        if self.handed.remove(key) {
            if let Some(lender) = self.lender.as_mut() {
                lender.take_back(key);
            }
            if let Some(key) = self.again.take(key) {
                self.enqueue(key, true);
            }
            if self.handed.is_empty() && self.handed.capacity() > KEEP_CAPACITY {
                self.handed = HashSet::new();
            }
            if let Some(waker) = self.waker.take() {
                waker.wake();
            }
        }
    }
}

/// What starts a controller's passes: the changes of its own objects, and objects found from
/// other watches, all through the queue.
pub struct Triggers<K: Resource> {
    inputs: Vec<BoxStream<'static, Vec<ObjectRef<K>>>>,
}

impl<K> Triggers<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    /// A pass for each changed object of `changes` (watch errors start none; the watch retries).
    pub fn new(changes: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static) -> Self {
        let refs = changes.filter_map(|change| std::future::ready(change.ok().map(|o| vec![ObjectRef::from_obj(&o)])));
        Triggers { inputs: vec![refs.boxed()] }
    }

    /// A pass for each object of `refs`.
    pub fn on(mut self, refs: impl Stream<Item = ObjectRef<K>> + Send + 'static) -> Self {
        self.inputs.push(refs.map(|object| vec![object]).boxed());
        self
    }

    /// A pass for each object `mapper` finds from an object of `stream` (watch errors find none).
    pub fn watches<T, I, E>(
        mut self,
        stream: impl Stream<Item = Result<T, E>> + Send + 'static,
        mapper: impl Fn(T) -> I + Send + 'static,
    ) -> Self
    where
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        let found = stream.map(move |item| item.map(|item| mapper(item).into_iter().collect()).unwrap_or_default());
        self.inputs.push(found.boxed());
        self
    }

    /// A pass for each owner of kind `K` of an object of `children`.
    pub fn owns<Child: Resource + Send + 'static, E>(
        self,
        children: impl Stream<Item = Result<Child, E>> + Send + 'static,
    ) -> Self {
        self.watches(children, |child: Child| {
            let namespace = child.meta().namespace.as_deref();
            let owners = child.meta().owner_references.iter().flatten();
            owners.filter_map(|owner| ObjectRef::from_owner_ref(namespace, owner, ())).collect::<Vec<_>>()
        })
    }

    /// A pass for every object in `store` each time `trigger` fires.
    pub fn all_on(mut self, trigger: impl Stream<Item = ()> + Send + 'static, store: impl Listing<K>) -> Self {
        let every = trigger.map(move |()| store.refs());
        self.inputs.push(every.boxed());
        self
    }

    /// kube's controller over `store`, its passes started through the queue, and the queue's
    /// handle, which sets how many kube may be handed at once and is told of each pass's end.
    pub fn controller(self, store: Store<K>) -> (Controller<K>, Front<K>) {
        self.build(store, None)
    }

    fn build(self, store: Store<K>, lender: Option<Box<dyn Lender>>) -> (Controller<K>, Front<K>) {
        let shared = Arc::new(Mutex::new(Shared { lender, ..Shared::new() }));
        let feed = Feed { inputs: futures::stream::select_all(self.inputs), shared: Arc::clone(&shared), timer: None };
        let controller =
            Controller::for_stream(futures::stream::empty::<Result<K, watcher::Error>>(), store).reconcile_on(feed);
        (controller, Front { shared, kind: PhantomData })
    }
}

impl<K: Slimmable> Triggers<K> {
    /// kube's controller over a slim cache (see `controller`): kube's own store holds only the
    /// objects it is handed, each rebuilt from `slim` as it is handed and dropped when its pass
    /// ends. An object gone from `slim` by then is not lent, and its pass ends as "not in the
    /// store", as one deleted meanwhile does.
    pub fn slim_controller(self, slim: SlimStore<K>) -> (Controller<K>, Front<K>) {
        let (store, mut writer) = reflector::store();
        // Nothing to list: kube's controller waits for a complete first list.
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let lender = SlimLender { slim, store: store.clone(), writer };
        self.build(store, Some(Box::new(lender)))
    }
}

/// Lends kube's controller the objects it is handed (`Triggers::slim_controller`).
trait Lender: Send {
    fn lend(&mut self, key: &str);
    fn take_back(&mut self, key: &str);
}

struct SlimLender<K: Slimmable> {
    slim: SlimStore<K>,
    store: Store<K>,
    writer: Writer<K>,
}

impl<K: Slimmable> Lender for SlimLender<K> {
    fn lend(&mut self, key: &str) {
        if let Some(slim) = self.slim.get_key(key) {
            self.writer.apply_watcher_event(&watcher::Event::Apply(slim.object()));
        }
    }

    fn take_back(&mut self, key: &str) {
        if let Some(lent) = self.store.get(&object_ref(key)) {
            self.writer.apply_watcher_event(&watcher::Event::Delete(K::clone(&lent)));
        }
    }
}

/// The queue's handle: told of each pass's end (`passed`) and of later passes (`asked`).
pub struct Front<K: Resource> {
    shared: Arc<Mutex<Shared>>,
    kind: PhantomData<fn(K)>,
}

impl<K: Resource> Clone for Front<K> {
    fn clone(&self) -> Self {
        Front { shared: Arc::clone(&self.shared), kind: PhantomData }
    }
}

impl<K: Resource<DynamicType = ()>> Front<K> {
    /// At most `limit` different objects handed to kube whose pass has not ended; `depth` shows
    /// how many wait here.
    pub fn configure(&self, limit: usize, depth: prometheus::IntGauge) {
        let mut shared = locked(&self.shared);
        shared.limit = limit.max(1);
        shared.depth = Some(depth);
        shared.show_depth();
    }

    /// Another pass of `object` after `after`, unless a request for it comes sooner.
    fn later(&self, object: &K, after: Duration) {
        let meta = object.meta();
        let key = key(meta.namespace.as_deref(), meta.name.as_deref().unwrap_or_default());
        locked(&self.shared).push_at(key, Instant::now() + after);
    }

    /// What kube is told after a pass of `object` that asked for `action`: to wait for a change,
    /// any later pass held here.
    pub fn asked(&self, object: &K, action: Action) -> KubeAction {
        if let Some(after) = action.requeue_after() {
            self.later(object, after);
        }
        KubeAction::await_change()
    }

    /// A pass result of kube's controller: its object may be handed again.
    pub fn passed<E, Q: std::error::Error>(&self, result: &Result<(ObjectRef<K>, KubeAction), ControllerError<E, Q>>) {
        let ended = match result {
            Ok((object, _)) => key(object.namespace.as_deref(), &object.name),
            Err(ControllerError::ReconcilerFailed(_, object) | ControllerError::ObjectNotFound(object)) => {
                key(object.namespace.as_deref(), &object.name)
            }
            Err(_) => return,
        };
        locked(&self.shared).passed(&ended);
    }
}

/// The stream kube's controller takes its requests from: every input is read as it comes (the
/// watches behind them must keep flowing), each request queued once, and handed on while fewer
/// than `limit` objects are out.
struct Feed<K: Resource> {
    inputs: SelectAll<BoxStream<'static, Vec<ObjectRef<K>>>>,
    shared: Arc<Mutex<Shared>>,
    /// Set for the next key asked for later.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<K: Resource<DynamicType = ()>> Stream for Feed<K> {
    type Item = ObjectRef<K>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ObjectRef<K>>> {
        let this = &mut *self;
        let mut shared = locked(&this.shared);
        // Ended inputs leave the queue as it is: kube's controller ends with its shutdown.
        while let Poll::Ready(Some(refs)) = this.inputs.poll_next_unpin(cx) {
            for object in refs {
                shared.push(key(object.namespace.as_deref(), &object.name));
            }
        }
        // Due keys join the queue; the timer wakes this stream for the next (a timer that has
        // fired by the time it is polled releases its keys on the next round).
        loop {
            let Some(next) = shared.release_due(Instant::now()) else {
                this.timer = None;
                break;
            };
            let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(next)));
            if timer.deadline() != next {
                timer.as_mut().reset(next);
            }
            if timer.as_mut().poll(cx).is_pending() {
                break;
            }
        }
        match shared.pop() {
            Some(key) => Poll::Ready(Some(object_ref(&key))),
            None => {
                shared.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use kube::runtime::controller::Error;

    use super::*;

    fn shared(limit: usize) -> Shared {
        Shared { limit, ..Shared::new() }
    }

    type Refs = futures::channel::mpsc::UnboundedSender<Vec<ObjectRef<ConfigMap>>>;

    /// A feed from one input that hands one object at a time, its front and its state.
    fn one_at_a_time() -> (Refs, Feed<ConfigMap>, Front<ConfigMap>, Arc<Mutex<Shared>>) {
        let (sender, receiver) = futures::channel::mpsc::unbounded::<Vec<ObjectRef<ConfigMap>>>();
        let state = Arc::new(Mutex::new(shared(1)));
        let inputs = futures::stream::select_all([receiver.boxed()]);
        let feed = Feed { inputs, shared: Arc::clone(&state), timer: None };
        (sender, feed, Front { shared: Arc::clone(&state), kind: PhantomData }, state)
    }

    #[test]
    fn keys_go_out_in_order_once_each_and_at_most_limit_at_a_time() {
        let mut queue = shared(2);
        let depth = prometheus::IntGauge::new("depth", "waiting").unwrap();
        queue.depth = Some(depth.clone());
        for name in ["a", "b", "a", "c", "b"] {
            queue.push(key(Some("ns"), name));
        }
        assert_eq!(depth.get(), 3, "a, b and c wait once each");
        assert_eq!(queue.pop().as_deref(), Some("ns/a"));
        assert_eq!(queue.pop().as_deref(), Some("ns/b"));
        assert_eq!(queue.pop(), None, "two are out");
        assert_eq!(depth.get(), 1);
        // Asked for again while out: queued again, to run after the pass that is out.
        queue.push(key(Some("ns"), "a"));
        queue.passed("ns/b");
        assert_eq!(queue.pop().as_deref(), Some("ns/c"));
        queue.passed("ns/a");
        assert_eq!(queue.pop().as_deref(), Some("ns/a"));
        queue.passed("ns/unknown");
        assert_eq!(queue.pop(), None);
    }

    #[test]
    fn a_long_queue_gives_its_tables_back_when_it_empties() {
        let mut queue = shared(1000);
        for i in 0..1000 {
            queue.push(key(None, &format!("n{i}")));
        }
        let mut out = Vec::new();
        while let Some(key) = queue.pop() {
            out.push(key);
        }
        assert_eq!(out.len(), 1000);
        assert!(queue.handed.capacity() >= 1000);
        for key in out {
            queue.passed(&key);
        }
        assert_eq!((queue.waiting.capacity(), queue.queued.capacity(), queue.handed.capacity()), (0, 0, 0));
    }

    #[test]
    fn a_later_pass_comes_when_due_once_and_a_request_meanwhile_stands_for_it() {
        let mut queue = shared(10);
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        queue.push_at(key(Some("ns"), "a"), at(10));
        queue.push_at(key(Some("ns"), "a"), at(20));
        queue.push_at(key(Some("ns"), "b"), at(5));
        queue.push_at(key(Some("ns"), "b"), at(2));
        assert_eq!(queue.release_due(at(1)), Some(at(2)));
        assert_eq!(queue.pop(), None, "nothing is due yet");
        assert_eq!(queue.release_due(at(5)), Some(at(10)), "b is due once, at the earlier time");
        assert_eq!(queue.pop().as_deref(), Some("ns/b"));
        assert_eq!(queue.pop(), None, "b's later entry is not a second pass");
        // A request for a while it waits runs now, and stands for the later pass.
        queue.push(key(Some("ns"), "a"));
        assert_eq!(queue.pop().as_deref(), Some("ns/a"));
        assert_eq!(queue.release_due(at(30)), None);
        assert_eq!(queue.pop(), None, "a's later pass went with the request");
        assert!(queue.due.is_empty() && queue.later.is_empty());
    }

    #[test]
    fn many_later_passes_give_their_tables_back_once_released() {
        let mut queue = shared(1000);
        let now = Instant::now();
        for i in 0..1000 {
            queue.push_at(key(None, &format!("n{i}")), now);
        }
        assert_eq!(queue.release_due(now), None);
        assert_eq!((queue.due.capacity(), queue.later.capacity()), (0, 0));
        assert_eq!(queue.waiting.len(), 1000);
    }

    #[tokio::test]
    async fn a_pass_that_asks_for_another_gets_it_through_the_queue() {
        let (_sender, mut feed, front, shared_state) = one_at_a_time();
        let object = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("a".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(front.asked(&object, Action::await_change()), KubeAction::await_change());
        assert!(locked(&shared_state).later.is_empty(), "no later pass asked for");
        assert_eq!(front.asked(&object, Action::requeue(Duration::from_millis(20))), KubeAction::await_change());
        let waker = futures::task::noop_waker();
        assert!(Pin::new(&mut feed).poll_next(&mut Context::from_waker(&waker)).is_pending(), "not due yet");
        let again = tokio::time::timeout(Duration::from_secs(30), feed.next()).await;
        assert_eq!(again, Ok(Some(ObjectRef::new("a").within("ns"))), "the timer brought it back");
    }

    #[test]
    fn a_key_asked_for_while_its_pass_is_out_goes_first_once_it_ends() {
        let mut queue = shared(3);
        queue.push(key(Some("ns"), "a"));
        assert_eq!(queue.pop().as_deref(), Some("ns/a"));
        queue.push(key(Some("ns"), "a"));
        queue.push(key(Some("ns"), "b"));
        assert_eq!(queue.pop().as_deref(), Some("ns/b"), "a waits for its pass");
        assert_eq!(queue.pop(), None);
        queue.push(key(Some("ns"), "a"));
        queue.push(key(Some("ns"), "c"));
        queue.passed("ns/a");
        assert_eq!(queue.pop().as_deref(), Some("ns/a"));
        assert_eq!(queue.pop().as_deref(), Some("ns/c"));
        assert_eq!(queue.pop(), None, "a is handed once");
    }

    #[test]
    fn kube_is_lent_each_object_of_a_slim_cache_it_is_handed_until_its_pass_ends() {
        use super::super::slim::SlimWriter;
        let (slim, mut slim_writer) = SlimWriter::<ConfigMap>::new();
        let cached: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ns", "uid": "u-1"}, "data": {"k": "v"}}))
        .unwrap();
        slim_writer.apply(&watcher::Event::Apply(cached.clone()));
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let lender = SlimLender { slim, store: store.clone(), writer };
        let mut queue = Shared { limit: 2, lender: Some(Box::new(lender)), ..Shared::new() };
        queue.push(key(Some("ns"), "a"));
        queue.push(key(Some("ns"), "gone"));
        assert!(store.state().is_empty(), "nothing lent before it is handed");
        assert_eq!(queue.pop().as_deref(), Some("ns/a"));
        let lent = store.get(&ObjectRef::new("a").within("ns")).expect("lent when handed");
        assert_eq!(serde_json::to_value(lent.as_ref()).unwrap(), serde_json::to_value(&cached).unwrap());
        assert_eq!(queue.pop().as_deref(), Some("ns/gone"));
        assert_eq!(store.state().len(), 1, "an object not in the slim cache is not lent");
        queue.passed("ns/a");
        queue.passed("ns/gone");
        assert!(store.state().is_empty(), "taken back when the pass ends");
    }

    #[test]
    fn keys_map_back_to_the_object() {
        let namespaced: ObjectRef<ConfigMap> = object_ref(&key(Some("ns"), "cm"));
        assert_eq!(namespaced, ObjectRef::new("cm").within("ns"));
        let cluster: ObjectRef<Namespace> = object_ref(&key(None, "ns"));
        assert_eq!(cluster, ObjectRef::new("ns"));
    }

    #[tokio::test]
    async fn inputs_are_read_while_kube_has_its_fill_and_results_let_more_out() {
        let (sender, mut feed, front, shared_state) = one_at_a_time();
        for name in ["a", "b", "c"] {
            sender.unbounded_send(vec![ObjectRef::new(name).within("ns")]).unwrap();
        }
        assert_eq!(feed.next().await, Some(ObjectRef::new("a").within("ns")));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut feed).poll_next(&mut cx).is_pending(), "one is out");
        sender.unbounded_send(vec![ObjectRef::new("d").within("ns")]).unwrap();
        assert!(Pin::new(&mut feed).poll_next(&mut cx).is_pending());
        assert_eq!(locked(&shared_state).waiting.len(), 3, "b, c and d read while one is out");
        let gone: Result<(ObjectRef<ConfigMap>, KubeAction), Error<std::io::Error, std::io::Error>> =
            Err(Error::ObjectNotFound(Box::new(ObjectRef::<ConfigMap>::new("a").within("ns").erase())));
        front.passed(&gone);
        assert_eq!(feed.next().await, Some(ObjectRef::new("b").within("ns")));
    }
}
