//! Router scoring: from raw gate logits to the chosen experts and their combine weights.
//!
//! Pure functions, shared by the reference forward pass and the router actor, so both make
//! exactly the same choices.

use super::config::RoutingKind;

/// How one MoE layer turns logits into choices.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterParams {
    /// Scoring and selection rule.
    pub kind: RoutingKind,
    /// Experts per token.
    pub top_k: usize,
    /// Renormalise the chosen weights.
    pub norm_topk_prob: bool,
    /// Multiplies the final weights.
    pub routed_scaling_factor: f32,
    /// Selection-only bias (`e_score_correction_bias`), one per expert.
    pub correction_bias: Option<Vec<f32>>,
}

/// The routing of a batch of tokens: `top_k` experts per token, best first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Routing {
    /// Experts per token.
    pub top_k: usize,
    /// `[tokens × top_k]` expert ids.
    pub ids: Vec<u32>,
    /// `[tokens × top_k]` combine weights.
    pub weights: Vec<f32>,
}

impl Routing {
    /// Number of tokens routed.
    pub fn n_tokens(&self) -> usize {
        self.ids.len().checked_div(self.top_k).unwrap_or(0)
    }
    /// For each expert that received tokens: `(expert, token rows, weights)`, by expert id.
    pub fn by_expert(&self) -> Vec<(u32, Vec<u32>, Vec<f32>)> {
        let mut map: std::collections::BTreeMap<u32, (Vec<u32>, Vec<f32>)> = Default::default();
        for (i, (&e, &w)) in self.ids.iter().zip(&self.weights).enumerate() {
            let entry = map.entry(e).or_default();
            entry.0.push((i / self.top_k) as u32);
            entry.1.push(w);
        }
        map.into_iter().map(|(e, (t, w))| (e, t, w)).collect()
    }
}

/// Sorts `idx` by `score` descending, ties to the lower index, and keeps the first `k`.
fn top_indices(score: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..score.len()).collect();
    idx.sort_by(|a, b| score[*b].total_cmp(&score[*a]).then(a.cmp(b)));
    idx.truncate(k);
    idx
}

/// Routes `n_tokens` rows of `logits` (`[n_tokens × n_experts]`).
pub fn route(p: &RouterParams, logits: &[f32], n_tokens: usize, n_experts: usize) -> Routing {
    let mut out = Routing { top_k: p.top_k, ids: Vec::with_capacity(n_tokens * p.top_k), weights: Vec::with_capacity(n_tokens * p.top_k) };
    for t in 0..n_tokens {
        let row = &logits[t * n_experts..(t + 1) * n_experts];
        let (chosen, mut weights): (Vec<usize>, Vec<f32>) = match p.kind {
            RoutingKind::SoftmaxTopK => {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exp: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
                let sum: f32 = exp.iter().sum();
                let probs: Vec<f32> = exp.iter().map(|e| e / sum).collect();
                let chosen = top_indices(&probs, p.top_k);
                let w = chosen.iter().map(|&i| probs[i]).collect();
                (chosen, w)
            }
            RoutingKind::SigmoidGroupLimited { n_group, topk_group } => {
                let scores: Vec<f32> = row.iter().map(|v| ft_backend::sigmoid(*v)).collect();
                let choice: Vec<f32> = match &p.correction_bias {
                    Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
                    None => scores.clone(),
                };
                let group_size = n_experts / n_group;
                let mut masked = choice.clone();
                if n_group > 1 {
                    // A group's score is the sum of its two best members.
                    let group_scores: Vec<f32> = (0..n_group)
                        .map(|g| {
                            let members = &choice[g * group_size..(g + 1) * group_size];
                            top_indices(members, 2.min(group_size)).iter().map(|&i| members[i]).sum()
                        })
                        .collect();
                    let keep = top_indices(&group_scores, topk_group);
                    for g in 0..n_group {
                        if !keep.contains(&g) {
                            masked[g * group_size..(g + 1) * group_size].iter_mut().for_each(|v| *v = 0.0);
                        }
                    }
                }
                let chosen = top_indices(&masked, p.top_k);
                let w = chosen.iter().map(|&i| scores[i]).collect();
                (chosen, w)
            }
            RoutingKind::SqrtSoftplus => {
                let scores: Vec<f32> = row.iter().map(|v| ft_backend::softplus(*v).sqrt()).collect();
                let chosen = match &p.correction_bias {
                    Some(b) => top_indices(&scores.iter().zip(b).map(|(s, b)| s + b).collect::<Vec<_>>(), p.top_k),
                    None => top_indices(&scores, p.top_k),
                };
                let w = chosen.iter().map(|&i| scores[i]).collect();
                (chosen, w)
            }
            RoutingKind::TopKSoftmax => {
                let chosen = top_indices(row, p.top_k);
                let max = chosen.first().map_or(0.0, |&i| row[i]);
                let exp: Vec<f32> = chosen.iter().map(|&i| (row[i] - max).exp()).collect();
                let sum: f32 = exp.iter().sum();
                (chosen, exp.into_iter().map(|e| e / sum).collect())
            }
        };
        finish_weights(p, &mut weights);
        out.ids.extend(chosen.iter().map(|&i| i as u32));
        out.weights.extend(weights);
    }
    out
}

/// Renormalises (where the rule does) and scales the chosen experts' weights.
fn finish_weights(p: &RouterParams, weights: &mut [f32]) {
    // gpt-oss's weights already sum to one; renormalising would be a no-op at best.
    if p.norm_topk_prob && p.kind != RoutingKind::TopKSoftmax {
        let eps = if matches!(p.kind, RoutingKind::SigmoidGroupLimited { .. } | RoutingKind::SqrtSoftplus) { 1e-20 } else { 0.0 };
        let sum: f32 = weights.iter().sum::<f32>() + eps;
        weights.iter_mut().for_each(|w| *w /= sum);
    }
    weights.iter_mut().for_each(|w| *w *= p.routed_scaling_factor);
}

/// Hash routing (DeepSeek-V4's first layers): token `tokens[t]` goes to the experts its row
/// of `table` (`[vocab, top_k]`) names, weighted by their `sqrt(softplus(logit))` scores as
/// score routing would weight them.
pub fn route_by_table(p: &RouterParams, table: &[u32], logits: &[f32], tokens: &[u32], n_experts: usize) -> Routing {
    let k = p.top_k;
    let mut out = Routing { top_k: k, ids: Vec::with_capacity(tokens.len() * k), weights: Vec::with_capacity(tokens.len() * k) };
    for (t, &tok) in tokens.iter().enumerate() {
        let row = &logits[t * n_experts..(t + 1) * n_experts];
        let ids = &table[tok as usize * k..(tok as usize + 1) * k];
        let mut weights: Vec<f32> = ids.iter().map(|&e| ft_backend::softplus(row[e as usize]).sqrt()).collect();
        finish_weights(p, &mut weights);
        out.ids.extend_from_slice(ids);
        out.weights.extend(weights);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(kind: RoutingKind, norm: bool) -> RouterParams {
        RouterParams { kind, top_k: 2, norm_topk_prob: norm, routed_scaling_factor: 1.0, correction_bias: None }
    }

    #[test]
    fn softmax_top_k_renormalises_when_asked() {
        let logits = [0.0, 2.0, 1.0, -1.0];
        let r = route(&params(RoutingKind::SoftmaxTopK, true), &logits, 1, 4);
        assert_eq!(r.ids, vec![1, 2]);
        assert!((r.weights[0] + r.weights[1] - 1.0).abs() < 1e-6);
        let r = route(&params(RoutingKind::SoftmaxTopK, false), &logits, 1, 4);
        assert!(r.weights[0] + r.weights[1] < 0.95);
    }

    #[test]
    fn correction_bias_changes_choice_but_not_weights() {
        let mut p = params(RoutingKind::SigmoidGroupLimited { n_group: 1, topk_group: 1 }, false);
        p.correction_bias = Some(vec![0.0, 0.0, 1.0, 0.0]);
        let logits = [3.0, 2.0, -2.0, 0.0];
        let r = route(&p, &logits, 1, 4);
        assert_eq!(r.ids, vec![2, 0]);
        assert!((r.weights[0] - ft_backend::sigmoid(-2.0)).abs() < 1e-7);
    }

    #[test]
    fn group_limit_excludes_weak_groups() {
        let p = RouterParams {
            kind: RoutingKind::SigmoidGroupLimited { n_group: 2, topk_group: 1 },
            top_k: 2,
            norm_topk_prob: true,
            routed_scaling_factor: 2.5,
            correction_bias: None,
        };
        // Group 0 = experts 0,1 (strong pair); group 1 holds the single best expert 2.
        let logits = [2.0, 2.0, 3.0, -5.0];
        let r = route(&p, &logits, 1, 4);
        assert_eq!(r.ids, vec![0, 1]);
        assert!((r.weights.iter().sum::<f32>() - 2.5).abs() < 1e-5);
    }

    #[test]
    fn top_k_then_softmax_normalises_over_the_chosen_only() {
        let logits = [1.0, 3.0, -1.0, 2.0];
        let r = route(&params(RoutingKind::TopKSoftmax, false), &logits, 1, 4);
        assert_eq!(r.ids, vec![1, 3]);
        let e = (-1f32).exp();
        assert!((r.weights[0] - 1.0 / (1.0 + e)).abs() < 1e-6 && (r.weights[1] - e / (1.0 + e)).abs() < 1e-6);
    }

    #[test]
    fn masked_groups_score_zero_like_transformers() {
        // A negative correction bias can push an allowed expert below the 0.0 that masked
        // experts get; transformers then picks the masked one, and so must we.
        let p = RouterParams {
            kind: RoutingKind::SigmoidGroupLimited { n_group: 2, topk_group: 1 },
            top_k: 2,
            norm_topk_prob: false,
            routed_scaling_factor: 1.0,
            correction_bias: Some(vec![0.0, -5.0, -0.9, -0.9]),
        };
        let logits = [4.0, 0.0, 0.0, 0.0];
        let r = route(&p, &logits, 1, 4);
        assert_eq!(r.ids, vec![0, 1]);
    }

    #[test]
    fn sqrt_softplus_picks_by_biased_score_and_weights_by_unbiased() {
        let mut p = params(RoutingKind::SqrtSoftplus, true);
        p.routed_scaling_factor = 1.5;
        p.correction_bias = Some(vec![0.0, 0.0, 5.0, 0.0]);
        let logits = [3.0, 1.0, -4.0, 0.0];
        let r = route(&p, &logits, 1, 4);
        assert_eq!(r.ids, vec![2, 0]);
        let s = |x: f32| ft_backend::softplus(x).sqrt();
        let sum = s(-4.0) + s(3.0);
        assert!((r.weights[0] - 1.5 * s(-4.0) / sum).abs() < 1e-6);
        assert!((r.weights[1] - 1.5 * s(3.0) / sum).abs() < 1e-6);
    }

    #[test]
    fn table_routing_takes_the_tables_experts_with_their_scores() {
        let mut p = params(RoutingKind::SqrtSoftplus, true);
        p.routed_scaling_factor = 2.0;
        let table = [3, 0, 1, 2];
        let logits = [0.5, 1.0, -1.0, 2.0, 0.5, 1.0, -1.0, 2.0];
        let r = route_by_table(&p, &table, &logits, &[0, 1], 4);
        assert_eq!(r.ids, vec![3, 0, 1, 2]);
        let s = |x: f32| ft_backend::softplus(x).sqrt();
        assert!((r.weights[0] - 2.0 * s(2.0) / (s(2.0) + s(0.5))).abs() < 1e-6);
        assert!((r.weights[2] + r.weights[3] - 2.0).abs() < 1e-5);
    }

    #[test]
    fn by_expert_groups_token_rows() {
        let r = Routing { top_k: 2, ids: vec![1, 0, 1, 2], weights: vec![0.5, 0.5, 0.7, 0.3] };
        let g = r.by_expert();
        assert_eq!(g[0], (0, vec![0], vec![0.5]));
        assert_eq!(g[1], (1, vec![0, 1], vec![0.5, 0.7]));
        assert_eq!(g[2], (2, vec![1], vec![0.3]));
    }
}
