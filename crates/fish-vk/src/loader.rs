//! Opens the Vulkan loader at run time; there is no link-time dependency, so
//! a machine without Vulkan simply runs CPU-only.

use crate::error::{Result, VkError};
use std::path::PathBuf;

/// Library paths to try, in order. On Windows only the application directory
/// and System32 are searched (never the working directory or PATH, which
/// would let a planted DLL in).
fn candidates() -> Vec<PathBuf> {
    if cfg!(windows) {
        let mut paths = Vec::new();
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from))
        {
            paths.push(dir.join("vulkan-1.dll"));
        }
        if let Ok(root) = std::env::var("SystemRoot") {
            paths.push(PathBuf::from(root).join("System32").join("vulkan-1.dll"));
        }
        paths
    } else if cfg!(target_os = "macos") {
        vec!["libvulkan.1.dylib".into(), "libMoltenVK.dylib".into()]
    } else {
        vec!["libvulkan.so.1".into(), "libvulkan.so".into()]
    }
}

/// Loads the first loader that opens; `explicit` replaces the default list.
pub(crate) fn load_entry(explicit: Option<&str>) -> Result<ash::Entry> {
    let paths = match explicit {
        Some(p) => vec![PathBuf::from(p)],
        None => candidates(),
    };
    let mut errors = Vec::new();
    for path in &paths {
        // SAFETY: loading the system's Vulkan loader runs its initialisers;
        // this is the documented way to use a run-time loaded loader.
        match unsafe { ash::Entry::load_from(path) } {
            Ok(entry) => return Ok(entry),
            Err(e) => errors.push(format!("{}: {e}", path.display())),
        }
    }
    Err(VkError::Loader(errors.join("; ")))
}
