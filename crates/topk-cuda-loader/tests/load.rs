//! What the loader says when the plugin is absent, is not a library, speaks
//! another ABI version, or cannot load because the NVIDIA driver's
//! `libcuda.so.1` is missing. The stand-in plugins are tiny C libraries
//! built here with the system C compiler (the one that links Rust).
//!
//! One test function: it points `TOPK_CUDA_PLUGIN` at each case in turn, and
//! the environment is process-wide.

use std::path::{Path, PathBuf};
use std::process::Command;

use topk_core::Metric;
use topk_cuda_loader::{abi, CudaConfig, LoadError};

/// Builds `source` into the shared library `out` with extra linker `args`.
fn cc_shared(dir: &Path, source: &str, out: &Path, args: &[&str]) {
    let c = dir.join("src.c");
    std::fs::write(&c, source).expect("write C source");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(out)
        .arg(&c)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler `{cc}`: {e}"));
    assert!(status.success(), "`{cc}` failed building {}", out.display());
}

/// Whether the dynamic loader of this process could find a `libcuda.so.1`.
fn driver_reachable() -> bool {
    let in_cache = Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(abi::DRIVER_LIBRARY))
        .unwrap_or(false);
    let on_path = std::env::var_os("LD_LIBRARY_PATH")
        .is_some_and(|v| std::env::split_paths(&v).any(|d| d.join(abi::DRIVER_LIBRARY).exists()));
    in_cache || on_path
}

fn point_at(path: &Path) {
    std::env::set_var(abi::PLUGIN_ENV, path);
}

fn open_err() -> LoadError {
    match topk_cuda_loader::open_rowmajor(&[1.0, 2.0], 2, Metric::Dot, &CudaConfig::default()) {
        Ok(_) => panic!("a stand-in plugin opened an engine"),
        Err(e) => e,
    }
}

#[test]
fn each_way_the_plugin_can_fail_to_load_is_named() {
    let tmp = tempfile::tempdir().expect("temp dir");

    // Absent: the message lists where it looked and how to build it.
    let missing: PathBuf = tmp.path().join("nowhere").join(abi::PLUGIN_FILE);
    point_at(&missing);
    let e = topk_cuda_loader::available().expect_err("no plugin file exists");
    assert!(
        matches!(&e, LoadError::NotFound { searched } if searched == std::slice::from_ref(&missing))
    );
    let msg = e.to_string();
    assert!(msg.contains(&missing.display().to_string()), "{msg}");
    assert!(msg.contains(abi::BUILD_COMMAND), "{msg}");
    assert!(matches!(open_err(), LoadError::NotFound { .. }));
    assert_eq!(
        topk_cuda_loader::plugin_path().err().map(|e| e.to_string()),
        Some(msg)
    );

    // A file that is not a library: the loader's reason, with the path.
    let junk = tmp.path().join("junk.so");
    std::fs::write(&junk, b"not an ELF file").expect("write junk");
    point_at(&junk);
    let e = topk_cuda_loader::available().expect_err("junk does not load");
    assert!(
        matches!(&e, LoadError::Load { path, .. } if path == &junk),
        "{e}"
    );
    assert!(e.to_string().contains(&junk.display().to_string()), "{e}");

    // Another ABI version: both numbers, and how to rebuild.
    let old = tmp.path().join("old.so");
    cc_shared(
        tmp.path(),
        "unsigned topk_cuda_plugin_abi_version(void) { return 999; }\n",
        &old,
        &[],
    );
    point_at(&old);
    let e = topk_cuda_loader::available().expect_err("version 999 is refused");
    assert!(
        matches!(
            e,
            LoadError::AbiMismatch {
                found: 999,
                expected: abi::ABI_VERSION,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains(abi::BUILD_COMMAND), "{e}");

    // A plugin that needs libcuda.so.1, built against a stand-in driver
    // library that is then removed: where no real driver is reachable, the
    // message names libcuda.so.1 and the missing NVIDIA driver; where one is
    // (a GPU machine), the library loads and lacks the ABI's entry points.
    let drv = tmp.path().join("drv");
    std::fs::create_dir_all(&drv).expect("mkdir");
    let fake_driver = drv.join(abi::DRIVER_LIBRARY);
    cc_shared(
        tmp.path(),
        "int cuInit(unsigned flags) { return flags ? 1 : 0; }\n",
        &fake_driver,
        &["-Wl,-soname,libcuda.so.1"],
    );
    let needs_driver = tmp.path().join("needs-driver.so");
    cc_shared(
        tmp.path(),
        &format!(
            "unsigned topk_cuda_plugin_abi_version(void) {{ return {}; }}\n",
            abi::ABI_VERSION
        ),
        &needs_driver,
        &[
            "-Wl,--no-as-needed",
            &format!("-L{}", drv.display()),
            "-l:libcuda.so.1",
        ],
    );
    std::fs::remove_file(&fake_driver).expect("remove the stand-in driver");
    point_at(&needs_driver);
    let e = open_err();
    if driver_reachable() {
        assert!(matches!(e, LoadError::MissingSymbol { .. }), "{e}");
    } else {
        assert!(matches!(&e, LoadError::DriverMissing { path, .. } if path == &needs_driver));
        let msg = e.to_string();
        assert!(msg.contains("libcuda.so.1"), "{msg}");
        assert!(msg.contains("NVIDIA driver is not installed"), "{msg}");
        // Through the core error type it stays the cuda backend's failure.
        let core: topk_core::Error = e.into();
        assert!(core.to_string().starts_with("cuda backend: "), "{core}");
    }
}
