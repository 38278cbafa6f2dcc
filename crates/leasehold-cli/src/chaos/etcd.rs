//! The etcd modes on the user's own etcd cluster (`--etcd-endpoints`, its
//! TLS files and `--etcd-user`): the flags checked before anything
//! starts, the cells that cannot run there set aside with a note, and the
//! user's access checked before the first run.

use anyhow::Context;
use leasehold_chaos::{Fault, Lab, LabOptions};

use crate::cli::{ChaosMode, MatrixArgs};
use crate::env::EtcdAccess;
use crate::exit::Usage;
use crate::progress::note;

/// The user's etcd cluster: its endpoints and how to reach them.
#[derive(Debug, Clone)]
pub(crate) struct EtcdTarget {
    pub(crate) endpoints: Vec<String>,
    pub(crate) access: EtcdAccess,
}

impl EtcdTarget {
    /// The target the flags name, if any, checked: usage errors (exit 2)
    /// before anything starts. The messages never quote an endpoint that
    /// holds a user or password.
    pub(crate) fn from_flags(args: &MatrixArgs) -> anyhow::Result<Option<EtcdTarget>> {
        let flags = &args.etcd;
        if flags.etcd_endpoints.is_empty() {
            return Ok(None);
        }
        let endpoints = flags.etcd_endpoints.clone();
        for endpoint in &endpoints {
            let Some(rest) = endpoint
                .strip_prefix("http://")
                .or_else(|| endpoint.strip_prefix("https://"))
            else {
                return Err(
                    Usage("--etcd-endpoints must be http:// or https:// URLs".to_owned()).into(),
                );
            };
            let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
            anyhow::ensure!(
                !authority.contains('@'),
                Usage(format!(
                    "--etcd-endpoints hold no user or password: give the user with --etcd-user and its password in {}",
                    crate::env::ETCD_PASSWORD_ENV
                ))
            );
        }
        let secure = endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        anyhow::ensure!(
            secure == 0 || secure == endpoints.len(),
            Usage("--etcd-endpoints mix http:// and https://".to_owned())
        );
        let access = flags.access()?;
        anyhow::ensure!(
            secure > 0 || !access.tls.is_set(),
            Usage(
                "--etcd-tls-ca, --etcd-tls-cert and --etcd-tls-key need https:// --etcd-endpoints"
                    .to_owned()
            )
        );
        if access.is_set() && args.modes.contains(&ChaosMode::EtcdLockRpc) {
            return Err(Usage(
                "mode etcd-lock-rpc does not run over TLS or as an etcd user (its Lock RPC client speaks neither): drop it from --modes, or use plain http:// --etcd-endpoints without --etcd-user".to_owned(),
            )
            .into());
        }
        if let Some(files) = access.tls_files() {
            // A file that cannot be read is a usage error too.
            leasehold::tls::client_config(&files)?;
        }
        Ok(Some(EtcdTarget { endpoints, access }))
    }

    /// The lab's options for the etcd modes: this cluster, its TLS files
    /// and its user.
    pub(crate) fn lab_options(&self) -> LabOptions {
        let mut options = LabOptions::default().etcd_endpoints(self.endpoints.clone());
        if let Some(files) = self.access.tls_files() {
            options = options.etcd_tls(files);
        }
        if let Some(credentials) = self.access.credentials() {
            options = options.etcd_credentials(credentials);
        }
        options
    }
}

/// Sets aside the etcd cells whose fault needs the etcd members'
/// processes (which the lab controls on its own throwaway cluster only),
/// with a note naming each; a usage error if no cell is left.
pub(crate) fn keep_runnable(
    cells: Vec<(ChaosMode, Fault)>,
) -> anyhow::Result<Vec<(ChaosMode, Fault)>> {
    let (run, skipped): (Vec<_>, Vec<_>) = cells
        .into_iter()
        .partition(|(mode, fault)| !mode.is_etcd() || !fault.needs_etcd_process());
    if !skipped.is_empty() {
        let names: Vec<String> = skipped
            .iter()
            .map(|(mode, fault)| format!("{} x {fault}", mode.name()))
            .collect();
        note!(
            "chaos: skipped with --etcd-endpoints (they kill, pause, cut off or restart etcd members, or raise the NOSPACE alarm, which the lab does on its own throwaway cluster only): {}",
            names.join(", ")
        );
    }
    anyhow::ensure!(
        !run.is_empty(),
        Usage(
            "with --etcd-endpoints, none of the chosen modes and faults can run (of the etcd faults only etcd-revoke runs on your cluster)"
                .to_owned()
        )
    );
    Ok(run)
}

/// Before any run: the user's etcd answers (over TLS, as the user), the
/// user may read and write the lock keys' prefix, and every chosen fault
/// can be injected there ([`Lab::check_fault`]). A refused password or
/// permission is the lab's typed error naming the endpoint.
pub(crate) async fn check_access(
    target: &EtcdTarget,
    cells: &[(ChaosMode, Fault)],
) -> anyhow::Result<()> {
    let mut faults: Vec<Fault> = Vec::new();
    for &(_, fault) in cells.iter().filter(|(mode, _)| mode.is_etcd()) {
        if !faults.contains(&fault) {
            faults.push(fault);
        }
    }
    if faults.is_empty() {
        return Ok(());
    }
    let options = target.lab_options();
    tokio::task::spawn_blocking(move || {
        let lab = Lab::start(&options).context("reaching --etcd-endpoints")?;
        faults
            .into_iter()
            .try_for_each(|fault| lab.check_fault(fault, &[]))
            .context("checking the faults on --etcd-endpoints")
    })
    .await
    .context("checking --etcd-endpoints")?
}
