pub mod cli;
pub mod condition;
pub mod driver;
pub mod dropin_command_lines;
pub mod leader;
pub mod registration;
pub mod rpcs;
pub mod security;
