//! A tokio service that enqueues from its HTTP handlers and works the jobs
//! in the same runtime, stopping cleanly on SIGTERM.
//!
//! - `POST /signup` with a name as the body puts a job on the `signups`
//!   tube through one `SharedProducer` every request shares (one
//!   connection, whatever the number of requests in flight) and answers
//!   with the job's id.
//! - A `taskq_worker::AsyncWorker` takes the jobs on the same runtime: its
//!   handler is async (the work here waits on a timer, as a call to another
//!   service would), all its jobs in flight share one connection, and it
//!   starts no thread of its own.
//! - On SIGTERM the HTTP server stops taking requests and finishes those in
//!   flight, then the worker stops taking jobs and finishes the ones it has.
//!
//! `TASKQ_ADDR=127.0.0.1:11300 LISTEN=127.0.0.1:8080 cargo run --example tokio_service`
//! (beanstalkd: the async worker does not run on JetStream yet). It prints
//! `listening on ADDR` once it serves, and its worker's counts as it ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use taskq_producer::{PutOptions, SharedProducer};
use taskq_worker::{AsyncJob, AsyncWorker, Config, Outcome};
use tokio::signal::unix::{signal, SignalKind};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("TASKQ_ADDR").unwrap_or_else(|_| "127.0.0.1:11300".into());
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    // The worker: up to 64 jobs in flight on one connection.
    let welcomed = Arc::new(AtomicU64::new(0));
    let cfg = Config {
        servers: vec![addr.clone()],
        tubes: vec!["signups".into()],
        concurrency: 64,
        ..Config::default()
    };
    let count = welcomed.clone();
    let worker = AsyncWorker::new(cfg, move |job: AsyncJob| {
        let count = count.clone();
        async move {
            // The work: here, a welcome for the name in the body, which
            // waits on another service as real work does.
            if job.body().is_empty() {
                return Outcome::Bury;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            count.fetch_add(1, Ordering::Relaxed);
            Outcome::Done
        }
    })?;
    let control = worker.control();

    let counts = rt.block_on(async move {
        let working = tokio::spawn(worker.run());
        let producer = SharedProducer::connect(&addr).await?;
        let app = Router::new()
            .route("/signup", post(signup))
            .with_state(producer);
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        println!("listening on {}", listener.local_addr()?);
        let mut term = signal(SignalKind::terminate())?;
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                term.recv().await;
            })
            .await?;
        // The server is done: the worker finishes the jobs it holds and stops.
        control.shutdown();
        Ok::<_, Box<dyn std::error::Error>>(working.await?)
    })?;
    println!(
        "stopped: welcomed {}, deleted {}, buried {}",
        welcomed.load(Ordering::Relaxed),
        counts.deleted,
        counts.buried
    );
    Ok(())
}

/// Puts the request's body as a job; answers with its id (503 when the
/// queue could not take it, saying whether it may be queued all the same).
async fn signup(State(p): State<SharedProducer>, body: axum::body::Bytes) -> (StatusCode, String) {
    match p.put("signups", &body, PutOptions::default()).await {
        Ok(id) => (StatusCode::OK, format!("{id}\n")),
        Err(e) if e.maybe_queued() => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("may be queued: {e}\n"),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not queued: {e}\n"),
        ),
    }
}
