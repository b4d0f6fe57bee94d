use shardwheel::Timer;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let timer = Timer::builder().build()?;
    let fired = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut handles = Vec::new();
    for i in 0..100_000u64 {
        let fired = fired.clone();
        handles.push(timer.schedule(Duration::from_millis(10 + i % 50), move || {
            fired.fetch_add(1, Ordering::Relaxed);
        })?);
    }
    println!("scheduled in {:?}", start.elapsed());
    let mut cancelled = 0;
    for h in handles.iter().step_by(2) {
        if h.cancel() {
            cancelled += 1;
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    println!(
        "fired {} cancelled {} stats {:?}",
        fired.load(Ordering::Relaxed),
        cancelled,
        timer.stats()
    );
    drop(handles);
    let unfired = timer.shutdown();
    println!("unfired {}", unfired.len());
    Ok(())
}
