//! `shardwheel-load`: the load generator; see the library's docs ([`shardwheel_load`]).

fn main() -> std::process::ExitCode {
    shardwheel_load::main()
}
