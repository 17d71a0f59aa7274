//! What makes pods one job: the labels the Kubeflow training operator (PyTorchJob) and
//! JobSet (hence a Kubeflow TrainJob) put on a job's pods, and gpuslice's own for any other
//! set of pods. The webhook keeps a job's ranks one per node by them and the console groups a
//! job's pods under the job (docs/kubeflow.md, "One rank per GPU per job").

/// The label that makes pods one job for gpuslice whatever made them.
pub const JOB_LABEL: &str = "gpuslice.io/job";
/// The training operator's job label (PyTorchJob and the other v1 kinds).
pub const TRAINING_JOB_LABEL: &str = "training.kubeflow.org/job-name";
/// JobSet's label on its pods (a TrainJob's JobSet bears the TrainJob's name).
pub const JOBSET_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";
/// The job labels in the order they are read: the documented label first (the user's own
/// grouping), then the operators'.
pub const JOB_LABELS: [&str; 3] = [JOB_LABEL, TRAINING_JOB_LABEL, JOBSET_LABEL];

/// The job of a pod whose labels `label` reads: the first of [`JOB_LABELS`] it carries with
/// a label value Kubernetes accepts, and that value. The webhook reads a pod before the API
/// server validates it, and the value goes into the pod's anti-affinity, an annotation and a
/// warning that kubectl prints: anything else (empty, too long, other characters) is no job.
pub fn job_of<'a>(label: impl Fn(&str) -> Option<&'a str>) -> Option<(&'static str, &'a str)> {
    JOB_LABELS
        .iter()
        .find_map(|k| label(k).filter(|v| is_label_value(v)).map(|v| (*k, v)))
}

/// Whether `v` is a label value Kubernetes accepts that is not empty: at most 63 characters,
/// alphanumerics, `-`, `_` and `.`, beginning and ending with an alphanumeric.
fn is_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn the_documented_label_wins_and_an_empty_value_is_no_job() {
        let labels = BTreeMap::from([
            (TRAINING_JOB_LABEL, "train"),
            (JOB_LABEL, "team"),
            (JOBSET_LABEL, "set"),
        ]);
        assert_eq!(
            job_of(|k| labels.get(k).copied()),
            Some((JOB_LABEL, "team"))
        );
        let labels = BTreeMap::from([(JOB_LABEL, ""), (JOBSET_LABEL, "set")]);
        assert_eq!(
            job_of(|k| labels.get(k).copied()),
            Some((JOBSET_LABEL, "set"))
        );
        assert_eq!(job_of(|_| None), None);
    }

    #[test]
    fn a_value_kubernetes_would_refuse_is_no_job() {
        let long = "a".repeat(64);
        for bad in ["-x", "x-", "a b", "x\u{1b}[31m", "x\ny", long.as_str()] {
            let labels = BTreeMap::from([(JOB_LABEL, bad)]);
            assert_eq!(job_of(|k| labels.get(k).copied()), None, "{bad:?}");
        }
        let ok = "a".repeat(63);
        for good in ["x", "rdzv-tj", "a.b_c-1", ok.as_str()] {
            let labels = BTreeMap::from([(JOB_LABEL, good)]);
            assert_eq!(job_of(|k| labels.get(k).copied()), Some((JOB_LABEL, good)));
        }
    }
}
