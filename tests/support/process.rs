//! What `/proc` says about this process: threads by name, resident memory (Linux).

/// Threads of this process whose name (`comm`, truncated to 15 bytes by Linux) starts with
/// `prefix`.
pub fn threads_named(prefix: &str) -> usize {
    thread_dirs_named(prefix).len()
}

/// The `/proc/self/task/TID` directories of [`threads_named`]`(prefix)`.
pub fn thread_dirs_named(prefix: &str) -> Vec<std::path::PathBuf> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .map(|task| task.path())
        .filter(|task| {
            std::fs::read_to_string(task.join("comm"))
                .is_ok_and(|name| name.trim_end().starts_with(prefix))
        })
        .collect()
}

/// Shard threads are named `shardwheel-shard-N`; Linux keeps 15 bytes of a thread's name.
pub const SHARD_THREAD: &str = "shardwheel-shar";
/// Executor pool threads are named `shardwheel-pool-N` (15 bytes: kept whole but the `-N`).
pub const EXEC_THREAD: &str = "shardwheel-pool";

/// Resident set size of this process, in pages (second field of `/proc/self/statm`).
pub fn resident_pages() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("resident field of /proc/self/statm")
}
