fn main() -> anyhow::Result<()> {
    operator::run(operator::ManagerCli::parse_args())
}
