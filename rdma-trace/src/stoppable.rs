//! A thread that loops until its owner lets it go: dropping the handle stops and joins it.

use std::{
    io,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

/// A named thread whose body loops until its stop flag reads true; dropping this sets the flag
/// and waits for the thread to end.
pub struct StoppableThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StoppableThread {
    /// Spawns thread `name` running `body`, which returns soon after the flag it is given reads
    /// true.
    pub fn spawn(name: &str, body: impl FnOnce(&AtomicBool) + Send + 'static) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(&flag))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for StoppableThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
