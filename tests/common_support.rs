//! Helpers shared by both support files (`engine_support.rs`, `async_support.rs`), which
//! include this file with `#[path = "common_support.rs"] mod common;`. Built as a test target
//! of its own it holds no tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// Polls `condition` every half millisecond until it holds or `timeout` passes; returns
/// whether it held.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if start.elapsed() > timeout {
            return condition();
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Installs (once per process) a panic hook that keeps quiet about panics whose message
/// contains "on purpose", and reports every other panic as usual.
pub fn quiet_intentional_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("");
            if !message.contains("on purpose") {
                default(info);
            }
        }));
    });
}
