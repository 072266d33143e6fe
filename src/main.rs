//! The `ft-actor` command.

fn main() -> std::process::ExitCode {
    ft_actor::cli::main()
}
