//! A child process killed (and reaped) when dropped. Shared by the guest tests of rdma-trace
//! (`tests/guest.rs`) and of rdma-demo (`rdma-demo/tests/guest.rs`, by path).

use std::{
    ops::{Deref, DerefMut},
    process::{Child, Command, Output},
};

/// A child that is killed (and reaped) when dropped, also when a test fails, so that nothing it
/// started outlives the test.
pub struct KillOnDrop(Option<Child>);

impl KillOnDrop {
    /// Starts `cmd`.
    pub fn spawn(cmd: &mut Command) -> Self {
        KillOnDrop(Some(
            cmd.spawn().unwrap_or_else(|e| panic!("start {cmd:?}: {e}")),
        ))
    }

    /// Takes over a child started elsewhere.
    #[allow(
        dead_code,
        reason = "shared by path; not every test crate adopts a child"
    )]
    pub fn adopt(child: Child) -> Self {
        KillOnDrop(Some(child))
    }

    /// Waits for the child's end and collects its output, as `Child::wait_with_output`.
    pub fn wait_with_output(mut self) -> Output {
        let child = self.0.take().expect("a child");
        let pid = child.id();
        child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("wait for child {pid}: {e}"))
    }
}

impl Deref for KillOnDrop {
    type Target = Child;

    fn deref(&self) -> &Child {
        self.0.as_ref().expect("a child")
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("a child")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
