pub mod faults;
pub mod interop;
pub mod story;
