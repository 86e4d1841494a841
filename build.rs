//! Compiles proto/csi.proto with a vendored protoc, so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let include = protoc_bin_vendored::include_path()?;
    // SAFETY: a build script is single-threaded; tonic-prost-build reads PROTOC.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(
            &[std::path::PathBuf::from("proto/csi.proto")],
            &[std::path::PathBuf::from("proto"), include],
        )?;
    println!("cargo:rerun-if-changed=proto/csi.proto");
    Ok(())
}
