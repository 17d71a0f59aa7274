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
/// a value that is not empty, and that value.
pub fn job_of<'a>(label: impl Fn(&str) -> Option<&'a str>) -> Option<(&'static str, &'a str)> {
    JOB_LABELS
        .iter()
        .find_map(|k| label(k).filter(|v| !v.is_empty()).map(|v| (*k, v)))
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
}
