//! Load through the Rust client, for bench/rust.py: `bench_client ADDRESS TASKS WINDOW [submit|call]`.
//!
//! `WINDOW` lanes each submit a noop task (the bench's ~100-byte payload), await its result, check
//! it, and go again, as bench/load.py does with the Python client: with `submit` then `result` (the
//! default), or with `call`, the one request whose only reply is the outcome. Prints one JSON line:
//! tasks, seconds, latencies' p50/p99 (ms) and this process's CPU seconds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

#[derive(Serialize)]
struct Noop {
    n: u64,
    op: &'static str,
    pad: &'static str,
}

const PAD: &str = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

/// CPU seconds this process used (user + system), from /proc/self/stat (clock ticks of 1/100 s).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn usage() -> ! {
    eprintln!("usage: bench_client ADDRESS TASKS WINDOW [submit|call]");
    std::process::exit(2);
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> cronoq::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (address, tasks, window, way) = match args.as_slice() {
        [_, a, t, w, rest @ ..] if rest.len() <= 1 => {
            let (tasks, window) = (t.parse::<usize>().expect("TASKS"), w.parse::<usize>().expect("WINDOW"));
            (a.clone(), tasks, window, rest.first().map_or("submit", String::as_str).to_string())
        }
        _ => usage(),
    };
    let by_call = match way.as_str() {
        "submit" => false,
        "call" => true,
        _ => usage(),
    };
    let sched = cronoq::connect(address).await?;
    sched.ping().await?; // connected and answered before the clock starts
    let next = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(tasks)));
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let mut lanes = Vec::new();
    for _ in 0..window.min(tasks) {
        let (sched, next, latencies) = (sched.clone(), next.clone(), latencies.clone());
        lanes.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= tasks {
                    return Ok::<_, cronoq::Error>(());
                }
                let t0 = Instant::now();
                let task = cronoq::Task::new(Noop { n: n as u64, op: "noop", pad: PAD });
                let got: u64 =
                    if by_call { sched.call(task).await? } else { sched.submit(task).await?.result().await? };
                assert_eq!(got, n as u64, "the handler hands back the task's number");
                latencies.lock().unwrap().push(t0.elapsed().as_secs_f64());
            }
        }));
    }
    for lane in lanes {
        lane.await.expect("a lane")?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;
    let mut lat = latencies.lock().unwrap().clone();
    lat.sort_by(f64::total_cmp);
    println!(
        "{{\"tasks\": {}, \"elapsed_s\": {elapsed}, \"p50_ms\": {}, \"p99_ms\": {}, \"cpu_s\": {cpu}}}",
        lat.len(),
        percentile(&lat, 0.5) * 1e3,
        percentile(&lat, 0.99) * 1e3
    );
    sched.close().await;
    Ok(())
}
