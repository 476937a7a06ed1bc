//! What the shared producer's tests on both engines have in common: many
//! tasks putting at once, the check of their outcomes against the server's
//! own record, a connection cut by byte counts, and a stalled server watched.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use taskq_producer::{Error, Producer, PutOptions, SharedProducer};
use taskq_testkit::{ChaosProxy, Direction, Toxic};

/// A multi-threaded runtime (two workers: callers and the driver really run
/// at once), the test's async part bounded in time.
pub fn run<T>(f: impl Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), f)
            .await
            .expect("the test's async part ends within 120 s")
    })
}

/// Polls `f` once, in the current task, and returns whether it finished.
async fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> bool {
    let mut f = Some(f);
    std::future::poll_fn(|cx| std::task::Poll::Ready(f.take().unwrap().poll(cx).is_ready())).await
}

/// On a current-thread runtime, so that the driver cannot run between
/// handing a put in and dropping it: connects a shared producer to `addr`,
/// hands in a put of `dropped` to `tube0` and drops its future before the
/// driver wrote it (it is taken back at once), then puts `kept` there.
/// Returns the kept put's id.
pub fn drop_one_before_its_write_then_put(addr: &str) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let p = SharedProducer::connect(addr).await.unwrap();
        {
            let dropped = std::pin::pin!(p.put("tube0", b"dropped", PutOptions::default()));
            assert!(!poll_once(dropped).await, "handed in, not answered");
            assert_eq!(p.waiting(), 1);
        }
        assert_eq!(p.waiting(), 0, "taken back at once");
        p.put("tube0", b"kept", PutOptions::default())
            .await
            .unwrap()
            .get()
    })
}

/// What each caller came to: (tube, body, outcome) for every put.
pub type Outcomes = Vec<(String, Vec<u8>, Result<u64, Error>)>;

/// The server's record: id (or stream sequence) → (tube, body).
pub type Record = HashMap<u64, (String, Vec<u8>)>;

/// The tube of task `t` of a run over `tubes` tubes.
pub fn tube_of(t: usize, tubes: usize) -> String {
    format!("tube{}", t % tubes)
}

/// `tasks` tasks each putting `per_task` distinct bodies into its tube
/// ([`tube_of`]), all sharing `p`.
pub async fn put_from_tasks(
    p: &SharedProducer,
    tasks: usize,
    per_task: usize,
    tubes: usize,
) -> Outcomes {
    let mut handles = Vec::new();
    for t in 0..tasks {
        let p = p.clone();
        handles.push(tokio::spawn(async move {
            let tube = tube_of(t, tubes);
            let mut out = Vec::with_capacity(per_task);
            for i in 0..per_task {
                let body = format!("task {t} job {i}").into_bytes();
                let r = p.put(&tube, &body, PutOptions::default()).await;
                out.push((tube.clone(), body, r.map(|id| id.get())));
            }
            out
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("a caller task"));
    }
    all
}

/// The checks every run ends with: each acknowledged id holds its caller's
/// body in its caller's tube; no id went to two callers; no body is stored
/// twice; jobs stored that no caller was told of are no more than the
/// unknown outcomes. Returns (acknowledged, unknown).
pub fn check_against_record(outcomes: &Outcomes, jobs: &Record) -> (usize, usize) {
    let mut acked = HashSet::new();
    let mut unknown = 0;
    for (tube, body, r) in outcomes {
        match r {
            Ok(id) => {
                assert!(acked.insert(*id), "id {id} was given to two callers");
                let (t, b) = jobs
                    .get(id)
                    .unwrap_or_else(|| panic!("acknowledged id {id} is not on the server"));
                assert_eq!((t, b), (tube, body), "job {id} holds another caller's put");
            }
            Err(e) if e.outcome_unknown() => unknown += 1,
            Err(e) => assert!(
                e.not_sent(),
                "a put neither stored, unknown nor not sent: {e}"
            ),
        }
    }
    let mut bodies = HashSet::new();
    for (id, (_, b)) in jobs {
        assert!(bodies.insert(b.clone()), "job {id}'s body is stored twice");
    }
    let unacked = jobs.keys().filter(|id| !acked.contains(id)).count();
    assert!(
        unacked <= unknown,
        "{unacked} jobs stored unacknowledged, only {unknown} unknown outcomes"
    );
    (acked.len(), unknown)
}

/// A shared producer through `proxy`, whose every connection from then on
/// is cut by `toxic` (a close or a reset after so many bytes) in
/// `direction`; `tasks` × `per_task` puts over two tubes. Returns the
/// outcomes and the connections opened.
pub fn cut_run(
    proxy: &ChaosProxy,
    url: &str,
    (direction, toxic): (Direction, Toxic),
    tasks: usize,
    per_task: usize,
) -> (Outcomes, u64) {
    run(async {
        let p = Producer::builder()
            .io_timeout(Duration::from_secs(2))
            .resolve_for(Duration::from_secs(60))
            .connect_shared(url)
            .await
            .unwrap();
        proxy.add(toxic, direction, 1.0);
        let outcomes = put_from_tasks(&p, tasks, per_task, 2).await;
        (outcomes, p.connects())
    })
}

/// With `max` puts allowed to wait: one put, then `stop` (the server stops
/// answering and reading), 400 puts from 200 tasks into `tube0`, watched
/// until every slot has been taken a while, then `cont`. Returns the
/// outcomes (all after `stop`) and the most puts ever seen waiting.
pub fn stalled_run(
    url: &str,
    max: usize,
    stop: impl FnOnce(),
    cont: impl FnOnce(),
) -> (Outcomes, usize) {
    run(async {
        let p = Producer::builder()
            .io_timeout(Duration::from_secs(60))
            .max_queued_puts(max)
            .connect_shared(url)
            .await
            .unwrap();
        p.put("tube0", b"before", PutOptions::default())
            .await
            .unwrap();
        stop();
        let callers = tokio::spawn({
            let p = p.clone();
            async move { put_from_tasks(&p, 200, 2, 1).await }
        });
        let mut most = 0;
        let mut full_for = 0;
        while full_for < 50 {
            let w = p.waiting();
            most = most.max(w);
            if w == max {
                full_for += 1;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(
            !callers.is_finished(),
            "400 puts cannot finish while the server is stopped"
        );
        cont();
        (callers.await.unwrap(), most)
    })
}
