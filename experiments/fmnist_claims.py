"""The claims docs/results.md judges, each as its seed paper states it (experiments/claims.py evaluates them).

One ``ClaimSpec`` per comparison: a claim over several methods ("beats every baseline") is one entry per
method, so that every entry names exactly the two lists of run files it compares. The seed's sentence is
quoted verbatim; ``stated`` is what the sentence (and the section around it) gives as conditions, ``run``
what the runs here used, ``deviations`` every difference between them. Equivalence and non-inferiority
margins are one value for every accuracy claim, ``MARGIN`` = 2 points, fixed here for all of them at
once (not per claim); it was set with the earlier rounds' numbers already on the page, not before them,
and every entry with a margin says so (``margin_basis``). Every entry where b is a baseline names it as
the ``opponent``, with FedAvg's runs of the same setting as the ``reference`` (experiments/claims.py's
opponent rule). Claims the runs here cannot test are entries too (role "not run", with the reason).

The FedSUM comparison is judged at the shared eta_0 (every algorithm at FedAvg's choice): the paper's
protocol ("all algorithms use the same local and global learning rates ... FedAvg"). The runs at each
algorithm's own eta_0 are shown on the page without verdicts.
"""

from __future__ import annotations

from pathlib import Path

from claims import ClaimSpec
from fmnist_flatness import FLATNESS_OUT, SAME_LOSS_LABELS, SAME_LOSS_OUT, flatness_file
from fmnist_runs import (
    ALPHAS,
    BETA2_GRID,
    CASE2_PROBABILITIES,
    PATTERNS,
    REPO,
    SMALL_BATCH,
    ablation_iid_specs,
    ablation_specs,
    case2p_constant_specs,
    case_specs,
    fadamgc_specs,
    fafed_full_specs,
    family128_specs,
    family_small_batch_specs,
    fedadamom_specs,
    fedsum_specs,
    paper_grid_lr,
    probe_specs,
    shared_lr,
    tuned_specs,
)

FEDSUM_SEED = "001_0cb4bdcca171ccd4.txt"  # You and Pu, FedSUM family (arXiv 2512.18275)
FEDADAMOM_SEED = "000_57fcad12ab300f5a.txt"  # FedAdamom (CVPR 2026), a summary in Chinese
FADAMGC_SEED = "002_c53b479aea7fd414.txt"  # FAdamGC's algorithm page
MARGIN = 0.02  # 2 points of accuracy: equivalence (±) and non-inferiority (−) margin of every accuracy claim
BASELINES = ("FedAvg", "FedAU", "FedAWE", "FedVARP", "MIFA", "SCAFFOLD")

Q_FIG1A = ("FedSUM and FedSUM-CR achieve faster convergence and greater stability than the baseline algorithms, "
           "which we attribute to its stochastic uplink\u2011merge technique combined with the correction direction.")
Q_FIG1B = ("Figure 1(b) further demonstrates that FedSUM and FedSUM-CR achieve faster convergence with respect to "
           "the communication workload.")
Q_CR = ("Notably, FedSUM-CR maintains the strong performance of FedSUM with improved communication efficiency, "
        "making it the most effective algorithm in this comparison.")
Q_CASES = "The results shown in Figure 9 confirm the robust performance of FedSUM under different patterns."
Q_CASE2P = ("The results imply that larger $p$ (and thus smaller $\\tau_{\\text{avg}}$ and $\\tau_{\\max}$) generally "
            "leads to better performance, which agrees with the theoretical findings.")
Q_H5 = ("Figure 11 further demonstrates that FedSUM-B and FedSUM-CR achieve performance comparable to or even better "
        "than FedSUM when further setting the constant and bigger local learning rate $\\eta_{l}=0.1$.")
Q_BIASED = ("The results in Figures 14(a) and 14(b) indicate that the bias issue discussed in Ribero et al. (2022); "
            "Sun et al. (2024) does not affect the performance of FedSUM, which is consistent with the benefits of "
            "the Stochastic Uplink-Merge (SUM) technique outlined in Appendix A.")
Q_FADAMGC = ("FAdamGC corrects this by tracking gradients: a global tracking variable \\(y_t\\) and per-client "
             "tracking variables \\(y_{i,t}\\) are maintained, and each local gradient is centered toward the "
             "global direction before being fed into the Adam moment estimates.")
Q_COMM = ("FedSUM achieves the same communication and memory cost as SCAFFOLD (Karimireddy et al., 2020; Huang et "
          "al., 2023) through single-variable uplink communication, whereas FedSUM-B and FedSUM-CR further achieve "
          "single-variable downlink communication to match the cost of FedAvg.")
Q_H5_SMALL = ("Under a smaller batch size (e.g., $8$ or $16$), the performance of FedSUM-B degrades while FedSUM "
              "takes the lead.")
Q_H6 = "It can be seen that FedSUM achieves the strongest performance in both cases."
Q_H7 = ("The FedSUM algorithm demonstrates competitive performance in terms of both loss reduction and accuracy "
        "improvement compared to FedAvg.")
Q_FEDADAMOM = ("本文用扩散理论解释了「FedAdam 收敛快但泛化差」的根因——自适应学习率削弱了对平坦极小的偏好——"
               "并据此提出 FedAdamom：把自适应机制从学习率挪到动量系数上，从而既保住快速逃离鞍点的能力、"
               "又恢复对平坦极小的选择，在 CIFAR-10/100、Tiny-ImageNet 与 LEAF 上同时取得更快收敛和更高精度。")
Q_BETA2 = "\\(\\beta_2\\) 在 0.01–0.3 范围内精度都稳定在高位，峰值在 0.05，说明对该超参不敏感、易调。"
Q_HETERO = ("对照 FedAdam：CIFAR-100 1000R 从 53.67% → 57.58%（+3.9），Tiny-ImageNet 从 41.75% → 47.38%（+5.6）"
            "——越是高异质、难任务，FedAdamom 相对 FedAdam 的泛化优势越大。")
Q_COST = ("开销对比：FedCAda 每轮需 3 倍通信（同时传模型和梯度信息），FAFED 为全参与设计、部分参与时性能骤降；"
          "FedAdamom 只传模型参数，无额外开销却整体更优。")
Q_LEAF = "LEAF 真实异质数据集（2000 客户端、每轮采 5 个，含特征偏移与数据不均衡）上同样领先："
Q_ESCAPE = ("逃逸率实验验证理论：在 Styblinski-Tang 测试函数上，FedAdamom 与 FedAvgM 满足 "
            "\\(-\\log(\\Gamma)=O(k^{-1})\\)（Pearson 0.998），FedAdam 则只满足 \\(O(k^{-1/2})\\)，"
            "定量证实 FedAdam 逃离尖锐极小对 Hessian 依赖更弱。")
Q_NEUTRAL = ("\\[\\log(\\tau_{\\text{FedAvg}})=O\\!\\Big(\\tfrac{2B\\Delta f}{\\eta\\eta_l H_{ae}}\\Big),"
             "\\quad \\log(\\tau_{\\text{FedAvgM}})=O\\!\\Big(\\tfrac{2(1-\\beta)B\\Delta f}{\\eta\\eta_l "
             "H_{ae}}\\Big),\\quad \\log(\\tau_{\\text{FedAdam}})=O\\!\\Big(\\tfrac{2\\sqrt{B}\\Delta f}"
             "{\\eta\\eta_l\\sqrt{H_{ae}}}\\Big)\\]")
Q_FLAT = "loss landscape 可视化：FedAdamom 收敛到的全局极小明显比 FedAdam/FedAvgM 更平坦、loss 更低，直接对应更好泛化。"

FEDSUM_STATED = ("the CNNs of Table 2 on MNIST, SVHN and CIFAR-10, N = 100, Dirichlet 0.1 (about 600 examples a "
                 "client), P1: S = 20, P2: p = 0.2, P3: a sine p(t); K = 10, batch 128, "
                 "η_l = η0/sqrt(t/10 + 1), η_g = 1, one η0 for every algorithm chosen by FedAvg's grid search "
                 "over {0.01, 0.005, 0.001, 0.0005}; 2000 rounds; read from curves")
FEDSUM_DEVIATIONS = (
    "Fashion-MNIST, not MNIST, SVHN or CIFAR-10",
    "N = 20 clients, not 100; S = 4, not 20 (the same 20% rate)",
    "about 3,000 examples per client, not about 600",
    "K = 5 local steps, not 10; batch 32, not 128",
    "100 rounds, not 2000",
    "η0 chosen over {0.01, 0.03, 0.1, 0.3, 1.0} by the lowest f(x) on tuning seeds 100-101, not over the paper's grid",
    "10 seeds with a 95% t-interval of the seed-paired difference; the paper's seed count is not stated",
)
RECONSTRUCTION = ("the FedSUM family's rules are reconstructions (the paper's text has no algorithm boxes): FedSUM's "
                  "server step x −= η_g η_l K y/N, its local step (η_l/N)(g_i + y_i), a stale step in a round "
                  "without clients; the probe/ rows read the server step without K and without the stale step")
PAPER_GRID = (0.01, 0.005, 0.001, 0.0005)  # the FedSUM paper's η0 grid (Sec. 5)


def lr_deviation(lr: float) -> str:
    """The shared η0 against the paper's grid: how far outside it the comparison ran."""
    if lr in PAPER_GRID:
        return f"η0 = {lr}, FedAvg's choice on the paper's grid {{0.01, 0.005, 0.001, 0.0005}} (the paper's protocol)"
    return (f"η0 = {lr}, {lr / max(PAPER_GRID):g} times the largest value of the paper's grid {{0.01, 0.005, 0.001, "
            "0.0005}, chosen by FedAvg on a wider grid; the same comparison at FedAvg's choice on the paper's grid "
            "is the paper-grid/ rows")


BASELINE_DEVIATIONS = {  # each baseline's own difference from its paper, in the runs here
    "FedAWE": "FedAWE clips the mean echoed update to norm r = 0.5 (algorithm.clip), a value from its official "
              "code, not from its paper",
    "SCAFFOLD": "SCAFFOLD in form: original (x and c up, 2d floats); the single-uplink SCAFFOLD the paper cites "
                "(Huang et al.) gives the same iterates with d up (tests/test_scaffold.py)",
}
FIG1A_NOT_TESTED = ("not tested: the attribution 'to its stochastic uplink-merge technique combined with the "
                    "correction direction'")
MARGIN_BASIS = ("post hoc: the 2-point margin was set for every accuracy claim at once with the earlier rounds' "
                "numbers on the page, not registered before the runs")
OPPONENT_FILES = "FedAvg's runs of the same setting are the reference of the opponent rule"
FEDADAMOM_STATED = ("ResNet-18 on CIFAR-10/100 and Tiny-ImageNet, 100 clients at 5% participation, Dirichlet "
                    "partition, 1000 rounds (LEAF: 2000 clients, 5 a round)")
FEDADAMOM_RUN = ("Fashion-MNIST, the MNIST CNN, N = 20, S = 4 uniform, K = 5, batch 32, local lr 0.1 × 0.998^t, "
                 "60 rounds, each server lr chosen on tuning seeds 100-101 at Dirichlet 0.1, seeds 0-9")
FEDADAMOM_DEVIATIONS = (
    "Fashion-MNIST with the FedSUM paper's MNIST CNN, not ResNet-18 on CIFAR or Tiny-ImageNet",
    "N = 20 at 20% participation, not 100 at 5%",
    "60 rounds, not 1000",
    "server lrs from small grids on two tuning seeds; the paper's tuning is not stated",
)


def _files(specs: list[dict]) -> tuple[str, ...]:
    """The summaries of ``specs`` ordered by seed (the pairing index)."""
    return tuple(s["summary"] for s in sorted(specs, key=lambda s: s["seed"]))


def _fedsum(pattern: str, label: str) -> tuple[str, ...]:
    return _files(fedsum_specs(shared_lr(), patterns=(pattern,), labels=[label]))


def shared_deviations(lr: float) -> tuple[str, ...]:
    """The deviations of every row of the FedSUM comparison at the shared η0 = ``lr``."""
    return (*FEDSUM_DEVIATIONS[:5], lr_deviation(lr), FEDSUM_DEVIATIONS[6], RECONSTRUCTION)


def own(base: str) -> tuple[str, ...]:
    """A baseline's own deviation from its paper, if it has one."""
    return (BASELINE_DEVIATIONS[base],) if base in BASELINE_DEVIATIONS else ()


def fedsum_claims(lr: float | None = None, prefix: str = "", command: str = "python experiments/fmnist.py fedsum",
                  reason: str = "") -> list[ClaimSpec]:
    """Fig. 1(a), 1(b), FedSUM-CR's claims and the communication counts at the shared η0 (default: FedAvg's
    choice on the wider grid; the paper-grid rows pass FedAvg's choice on the paper's grid), per pattern and
    per baseline."""
    lr = shared_lr() if lr is None else lr
    devs = shared_deviations(lr)

    def files(p: str, label: str) -> tuple[str, ...]:
        return _files(fedsum_specs(lr, patterns=(p,), labels=[label]))

    out = []
    others = [*BASELINES, "FedSUM-B"]
    for p in PATTERNS:
        P = p.upper()
        run = (f"Fashion-MNIST, {P}, N = 20, S = 4, K = 5, batch 32, η_l = η0/sqrt(t/10 + 1) at the shared "
               f"η0 = {lr} (FedAvg's choice), η_g = 1, 100 rounds, seeds 0-9")
        common = {"seed": FEDSUM_SEED, "stated": FEDSUM_STATED, "run": run, "command": command, "reason": reason}
        reference = files(p, "FedAvg")

        def versus(base: str, reference: tuple[str, ...] = reference) -> dict:
            """The opponent fields of a row against ``base``."""
            return {"opponent": base, "reference": reference}

        for ours in ("FedSUM", "FedSUM-CR"):
            for base in BASELINES:
                pair = {"a": files(p, ours), "b": files(p, base), **versus(base)}
                fig1a = (*devs, *own(base), FIG1A_NOT_TESTED)
                out += [
                    ClaimSpec(id=f"{prefix}fig1a-faster-r25/{P}/{ours}-vs-{base}", quote=Q_FIG1A, kind="greater",
                              deviations=(*fig1a, "faster convergence read as higher test accuracy at the first "
                                          "evaluation (round 25 of 100); rounds to a common accuracy: "
                                          "fig1a-rounds-to-target"),
                              metric="test_accuracy", round=25, scale=100, **pair, **common),
                    ClaimSpec(id=f"{prefix}fig1a-faster-final/{P}/{ours}-vs-{base}", quote=Q_FIG1A, kind="greater",
                              deviations=(*fig1a, "faster convergence read as higher test accuracy at round 100, "
                                          "early in training (about one pass over the data)"),
                              metric="test_accuracy", round="final", scale=100, **pair, **common),
                    ClaimSpec(id=f"{prefix}fig1a-rounds-to-target/{P}/{ours}-vs-{base}", quote=Q_FIG1A,
                              kind="less",
                              deviations=(*fig1a, "faster convergence read as fewer rounds to the test accuracy "
                                          "both runs of a seed reach (the lower of their round-100 accuracies; "
                                          "the curve interpolated between the evaluations every 25 rounds from "
                                          "chance at round 0); defined in the fifth round; the stored training "
                                          "loss is not used: it is the active clients' loss during their local "
                                          "steps, lower for a method whose local steps fit the client's own data"),
                              metric="rounds_to_accuracy", round="common accuracy", **pair, **common),
                    ClaimSpec(id=f"{prefix}fig1a-stability/{P}/{ours}-vs-{base}", quote=Q_FIG1A, kind="less",
                              statistic="sd ratio",
                              deviations=(*fig1a, "greater stability read as a smaller spread of the final test "
                                          "accuracy over the seeds (the ratio of standard deviations), not as "
                                          "smoother curves within a run (that is fig1a-within-run)"),
                              metric="test_accuracy", round="final", scale=100, **pair, **common),
                    ClaimSpec(id=f"{prefix}fig1a-within-run/{P}/{ours}-vs-{base}", quote=Q_FIG1A, kind="less",
                              deviations=(*fig1a, "greater stability read as smoother curves within a run: the "
                                          "mean absolute round-to-round change of the log training loss over "
                                          "rounds 50-100, lower is smoother; test accuracy is evaluated every 25 "
                                          "rounds only, too seldom for a curve statistic; the stored loss is the "
                                          "active clients' loss during their local steps, not the global "
                                          "training loss the paper plots, so its changes mix which clients took "
                                          "part with how the model moved; defined in the fifth round; a diverged "
                                          "run has no value (its seed drops out)"),
                              metric="within_run_change", round="rounds 50-100", **pair, **common),
                ]
        budget = ("accuracy at the float count (up + down) both runs reached, interpolated linearly between the "
                  "evaluations every 25 rounds; a diverged run counts as chance")
        for base in BASELINES:
            out.append(ClaimSpec(id=f"{prefix}fig1b-per-float/{P}/FedSUM-vs-{base}", quote=Q_FIG1B, kind="greater",
                                 deviations=(*devs, *own(base), budget), metric="budget_accuracy", round="final",
                                 scale=100, a=files(p, "FedSUM"), b=files(p, base), **versus(base), **common))
        for base in [*others, "FedSUM"]:
            out.append(ClaimSpec(id=f"{prefix}cr-most-effective/{P}/FedSUM-CR-vs-{base}", quote=Q_CR, kind="greater",
                                 deviations=(*devs, *own(base), "'most effective' read as the highest " + budget),
                                 metric="budget_accuracy", round="final", scale=100,
                                 a=files(p, "FedSUM-CR"), b=files(p, base), **versus(base), **common))
        out.append(ClaimSpec(id=f"{prefix}cr-maintains/{P}/FedSUM-CR-vs-FedSUM", quote=Q_CR, kind="greater",
                             margin=MARGIN, margin_basis=MARGIN_BASIS,
                             deviations=(*devs, "'maintains the strong performance' tested as non-inferiority of "
                                         "the final test accuracy within 2 points"),
                             metric="test_accuracy", round="final", scale=100,
                             a=files(p, "FedSUM-CR"), b=files(p, "FedSUM"), **versus("FedSUM"), **common))
        if prefix:
            continue
        counts = ("an exact count from the run files (floats per active client per round, uplink_floats and "
                  "downlink_floats over the whole run), the same in every seed: the interval is the range of the "
                  "per-seed ratios; a run that diverged has no count and drops out")
        for a_label, b_label, link, extra in (
                ("FedSUM", "SCAFFOLD", "uplink", (BASELINE_DEVIATIONS["SCAFFOLD"],)),
                ("FedSUM", "SCAFFOLD", "downlink", ()),
                ("FedSUM-B", "FedAvg", "downlink", ()), ("FedSUM-CR", "FedAvg", "downlink", ())):
            out.append(ClaimSpec(
                id=f"comm-cost/{P}/{link}/{a_label}-vs-{b_label}", quote=Q_COMM, kind="equivalent", margin=0.01,
                statistic="exact ratio", null=1.0, margin_basis="1% of the count: FedSUM-CR's extra downlink float "
                "(d + 1 floats, d = 21,840) is within it", metric=f"{link}_per_client", round="whole run",
                deviations=(*devs, *extra, counts, "not tested: the memory cost"), a=files(p, a_label),
                b=files(p, b_label), **common))
    return out


def _by(specs: list[dict], group: str, label: str) -> tuple[str, ...]:
    return _files([s for s in specs if s["group"] == group and s["label"] == label])


H8_LEVELS = "H.8's levels compressed to two clients a level (its rule at N = 20 gives only p = 0.5 and 0.45)"


def appendix_claims() -> list[ClaimSpec]:
    """H.4 (Cases 1-4, Case 2 over p), H.5 (the family at batch 128) and H.8 (biased sampling)."""
    cases = case_specs()
    lr = shared_lr()
    run = (f"Fashion-MNIST, N = 20, K = 5, batch 32, η_l = η0/sqrt(t/10 + 1) at η0 = {lr}, 100 rounds, seeds 0-9; "
           "Case 1: S = 4 uniform, Case 2: p = 0.2, Case 3: blocks of 4 in a fixed order, Case 4: reshuffled")
    cmd = "python experiments/fmnist.py cases"
    out = [ClaimSpec(id=f"h4-robust/Case{k}-vs-Case1", seed=FEDSUM_SEED, quote=Q_CASES,
                     stated="FedSUM under Cases 1-4, CNNs on MNIST, SVHN and CIFAR-10 (Fig. 9; no other "
                            "settings are given there, presumably Fig. 1's: N = 100, K = 10, batch 128, 2000 rounds)",
                     run=run, kind="equivalent", margin=MARGIN, margin_basis=MARGIN_BASIS,
                     deviations=(*FEDSUM_DEVIATIONS, RECONSTRUCTION, "robust performance tested as equivalence of "
                                 "the final test accuracy with Case 1's within ±2 points"),
                     metric="test_accuracy", round="final", scale=100, a=_by(cases, f"cases/Case{k}", "FedSUM"),
                     b=_by(cases, "cases/Case1", "FedSUM"), command=cmd)
           for k in (2, 3, 4)]
    out.append(ClaimSpec(id="h8-biased/Biased-vs-Case1", seed=FEDSUM_SEED, quote=Q_BIASED,
                         stated="N = 100, clients 1-11 at p = 0.5, 12-22 at 0.45, ... (11 clients per level), "
                                "the Fig. 1 settings otherwise",
                         run=run.replace("; Case 1", "; biased: ten levels p = 0.50 ... 0.05, two clients each "
                                         "(configs/fmnist/biased_n20.csv); Case 1"),
                         kind="equivalent", margin=MARGIN, margin_basis=MARGIN_BASIS,
                         deviations=(*FEDSUM_DEVIATIONS, RECONSTRUCTION, H8_LEVELS, "'does not affect' tested as "
                                     "equivalence of the final test accuracy with Case 1's within ±2 points"),
                         metric="test_accuracy", round="final", scale=100, a=_by(cases, "cases/Biased", "FedSUM"),
                         b=_by(cases, "cases/Case1", "FedSUM"), command=cmd))
    out.append(ClaimSpec(id="h8-biased/FedSUM-vs-FedAvg", seed=FEDSUM_SEED, quote=Q_BIASED,
                         stated="FedSUM against FedAvg under H.8's biased sampling (Fig. 14), N = 100, the Fig. 1 "
                                "settings otherwise",
                         run=run.replace("; Case 1", "; biased: ten levels p = 0.50 ... 0.05, two clients each "
                                         "(configs/fmnist/biased_n20.csv); Case 1"),
                         kind="greater", opponent="FedAvg",
                         deviations=(*FEDSUM_DEVIATIONS, RECONSTRUCTION, H8_LEVELS, "Fig. 14 sets FedSUM beside "
                                     "FedAvg under the bias: tested as FedSUM more accurate than FedAvg at round "
                                     "100 under it (the sentence itself claims no effect of the bias: h8-biased/"
                                     "Biased-vs-Case1)"),
                         metric="test_accuracy", round="final", scale=100, a=_by(cases, "cases/Biased", "FedSUM"),
                         b=_by(cases, "cases/Biased", "FedAvg"), command=cmd))
    sweep = case2p_constant_specs()
    for lo, hi in zip(CASE2_PROBABILITIES, CASE2_PROBABILITIES[1:], strict=False):
        out.append(ClaimSpec(
            id=f"h4-case2-p/p{hi}-vs-p{lo}", seed=FEDSUM_SEED, quote=Q_CASE2P,
            stated="FedSUM, Case 2 at several p, Dirichlet 0.1, constant η_g = 1.0 and η_l = 0.01 (Fig. 10)",
            run="Fashion-MNIST, N = 20, K = 5, batch 32, Case 2 at p ∈ {0.05, 0.1, 0.2, 0.5, 0.8}, constant "
                "η_g = 1.0, η_l = 0.01, 100 rounds, seeds 0-9",
            kind="greater", deviations=(*FEDSUM_DEVIATIONS[:5], RECONSTRUCTION, "'generally leads to better "
                                        "performance' tested step by step: each p against the next smaller one"),
            metric="test_accuracy", round="final", scale=100, a=_by(sweep, "case2p_constant", f"FedSUM p={hi}"),
            b=_by(sweep, "case2p_constant", f"FedSUM p={lo}"), command="python experiments/fmnist.py case2p_constant"))
    family = family128_specs()
    for p in PATTERNS:
        for label in ("FedSUM-B", "FedSUM-CR"):
            out.append(ClaimSpec(
                id=f"h5-batch128/{p.upper()}/{label}-vs-FedSUM", seed=FEDSUM_SEED, quote=Q_H5,
                stated="the FedSUM family at batch 128 and a constant η_l = 0.1, about 600 examples a client",
                run=f"Fashion-MNIST, {p.upper()}, N = 20, K = 5, batch 128, constant η_l = 0.1, η_g = 1, 100 rounds, "
                    "seeds 0-9",
                kind="greater", margin=MARGIN, margin_basis=MARGIN_BASIS, opponent="FedSUM",
                deviations=(*FEDSUM_DEVIATIONS[:3], "K = 5 local steps, not 10", "100 rounds, not 2000",
                            RECONSTRUCTION, "'comparable to or even better' tested as non-inferiority within 2 "
                            "points"),
                metric="test_accuracy", round="final", scale=100, a=_by(family, f"family128/{p}", label),
                b=_by(family, f"family128/{p}", "FedSUM"), command="python experiments/fmnist.py family128"))
    small = family_small_batch_specs()
    for p in PATTERNS:
        out.append(ClaimSpec(
            id=f"h5-small-batch/{p.upper()}/FedSUM-vs-FedSUM-B", seed=FEDSUM_SEED, quote=Q_H5_SMALL,
            stated="the FedSUM family at a constant η_l = 0.1 with batch 8 or 16, about 600 examples a client",
            run=f"Fashion-MNIST, {p.upper()}, N = 20, K = 5, batch {SMALL_BATCH}, constant η_l = 0.1, η_g = 1, "
                "100 rounds, seeds 0-9",
            kind="greater", deviations=(*FEDSUM_DEVIATIONS[:3], "K = 5 local steps, not 10", "100 rounds, not 2000",
                                        RECONSTRUCTION, "'FedSUM takes the lead' tested as FedSUM more accurate than "
                                        "FedSUM-B at round 100; batch 8 not run"),
            metric="test_accuracy", round="final", scale=100, a=_by(small, f"family{SMALL_BATCH}/{p}", "FedSUM"),
            b=_by(small, f"family{SMALL_BATCH}/{p}", "FedSUM-B"), command="python experiments/fmnist.py "
            "family_small_batch", reason="90 runs of 100 rounds at batch 16, about 45 core-minutes (the command "
            "continues from the runs whose files exist)"))
    not_run = {"seed": FEDSUM_SEED, "role": "not run", "kind": "greater", "metric": "test_accuracy",
               "round": "final", "run": "not run", "deviations": ()}
    out += [
        ClaimSpec(id="h6-resnet18/FedSUM-vs-FedAvg-SCAFFOLD", quote=Q_H6,
                  stated="ResNet-18 on CIFAR-10 and CIFAR-100, K = 10, batch 32, η_l = 0.01 (CIFAR-10) and 0.001, "
                         "η_g = 1 (H.6)", reason="ResNet-18 on CIFAR at the paper's scale is beyond two shared CPU "
                         "cores, and CIFAR is not on this machine", a=(), b=(), **not_run),
        ClaimSpec(id="h7-sst2/FedSUM-vs-FedAvg", quote=Q_H7,
                  stated="bert-base-uncased fine-tuned on SST-2, 8 i.i.d. clients, 2 a round, K = 3, batch 4, "
                         "η_l = 1e-4, 4000 rounds (H.7)", reason="BERT fine-tuning needs the pre-trained weights and "
                         "SST-2, neither on this machine, and far more compute than two CPU cores", a=(), b=(),
                  **not_run)]
    return out


def fadamgc_claims() -> list[ClaimSpec]:
    specs = fadamgc_specs(choose=True)
    return [ClaimSpec(
        id="fadamgc/FAdamGC-vs-LocalAdam", seed=FADAMGC_SEED, quote=Q_FADAMGC,
        stated="the page gives no experiment: the correction should remove the drift of uncorrected local Adam "
               "under heterogeneous data",
        run="Fashion-MNIST, P1 of the FedSUM comparison (N = 20, S = 4, K = 5, batch 32), each variant's local lr "
            "chosen on tuning seeds 100-101, 100 rounds, seeds 0-9",
        deviations=("the sentence states a mechanism ('corrects this', the drift of local Adam under heterogeneous "
                    "data), not an experiment: tested as FAdamGC more accurate at round 100 than the same local "
                    "AMSGrad without the correction (algorithm.correction: false)",
                    "not tested: the drift itself (the distance of the aggregated update from the full gradient)"),
        kind="greater", metric="test_accuracy", round="final", scale=100, opponent="Local Adam",
        reference=_files([s for s in tuned_specs(("p1",)) if s["label"] == "FedAvg"]),
        a=_files([s for s in specs if s["label"].startswith("FAdamGC")]),
        b=_files([s for s in specs if s["label"].startswith("Local Adam")]),
        command="python experiments/fmnist.py fadamgc")]


ABLATION = "python experiments/fmnist.py ablation"


FEDADAMOM_NOT_TESTED = ("not tested here: the diffusion-theory account (the escape/ rows test its escape-rate "
                        "prediction) and the LEAF claims (not run)")


def _methods(specs: list[dict]) -> dict[str, list[dict]]:
    """method -> its specs, from labels 'Method knob=value'."""
    rows: dict[str, list[dict]] = {}
    for s in specs:
        rows.setdefault(s["label"].split(" ")[0], []).append(s)
    return rows


def fedadamom_claims() -> list[ClaimSpec]:
    """FedAdamom against every server at both Dirichlet alphas (accuracy, rounds to a target, the growth of
    the gain with heterogeneity); communication; β2; flatness against FedAdam and FedAvgM; escape rates."""
    out = []
    cmd = "python experiments/fmnist.py fedadamom"
    by_alpha = {alpha: _methods(fedadamom_specs(True, (alpha,))) for alpha in ALPHAS}
    for alpha, rows in by_alpha.items():
        ref = _files(rows["FedAvg"])
        run = f"{FEDADAMOM_RUN}; Dirichlet {alpha}"
        for other in (m for m in rows if m != "FedAdamom"):
            out.append(ClaimSpec(
                id=f"fedadamom-accuracy/alpha{alpha}/FedAdamom-vs-{other}", seed=FEDADAMOM_SEED, quote=Q_FEDADAMOM,
                stated=FEDADAMOM_STATED, run=run, opponent=other, reference=ref,
                deviations=(*FEDADAMOM_DEVIATIONS, FEDADAMOM_NOT_TESTED, "higher accuracy read as final test "
                            "accuracy (round 60); 'faster convergence' is the fedadamom-rounds-to-target rows"),
                kind="greater", metric="test_accuracy", round="final", scale=100, a=_files(rows["FedAdamom"]),
                b=_files(rows[other]), command=cmd))
        for other in ("FedCAda", "FedAvgM", "FADAS"):  # the strongest baselines of the paper's rounds-to-target
            out.append(ClaimSpec(
                id=f"fedadamom-rounds-to-target/alpha{alpha}/FedAdamom-vs-{other}", seed=FEDADAMOM_SEED,
                quote=Q_FEDADAMOM, stated=f"{FEDADAMOM_STATED}; rounds to a target accuracy: CIFAR-10 81% 307 "
                "(FedCAda 325), CIFAR-100 50% 392 (FedAvgM 435), Tiny-ImageNet 40% 353 (FADAS 517)", run=run,
                opponent=other, reference=ref,
                deviations=(*FEDADAMOM_DEVIATIONS, FEDADAMOM_NOT_TESTED, "faster convergence read as fewer rounds "
                            "to the test accuracy both runs of a seed reach (the lower of their round-60 "
                            "accuracies; the curve interpolated between the evaluations at rounds 20, 40, 60 from "
                            "chance at round 0), not a fixed target; each baseline at both alphas, not one per "
                            "data set; defined in the fifth round"),
                kind="less", metric="rounds_to_accuracy", round="common accuracy", a=_files(rows["FedAdamom"]),
                b=_files(rows[other]), command=cmd))
    low, high = by_alpha[0.1], by_alpha[0.5]
    out.append(ClaimSpec(
        id="fedadamom-heterogeneity/FedAdamom-vs-FedAdam", seed=FEDADAMOM_SEED, quote=Q_HETERO,
        stated="FedAdamom against FedAdam at 1000 rounds on CIFAR-100 and Tiny-ImageNet (the gain grows with "
               "heterogeneity and difficulty)", run=f"{FEDADAMOM_RUN}; Dirichlet 0.1 (a, b) and 0.5 (c, d)",
        deviations=(*FEDADAMOM_DEVIATIONS, "'the more heterogeneous, the larger the gain' tested as an interaction: "
                    "(FedAdamom − FedAdam at Dirichlet 0.1) − (the same at 0.5), final test accuracy, seed-paired",
                    "not tested: 'the harder the task' (one data set)"),
        kind="greater", statistic="difference of differences", metric="test_accuracy", round="final", scale=100,
        a=_files(low["FedAdamom"]), b=_files(low["FedAdam"]), c=_files(high["FedAdamom"]), d=_files(high["FedAdam"]),
        command=cmd))
    costs = ("an exact count from the run files (floats up + down per active client per round over the whole "
             "run), the same in every seed: the interval is the range of the per-seed ratios")
    out.append(ClaimSpec(
        id="fedcada-3x/floats/FedCAda-vs-FedAdamom", seed=FEDADAMOM_SEED, quote=Q_COST,
        stated="FedCAda sends model and gradient information: 3 times the communication per round",
        run=f"{FEDADAMOM_RUN}; Dirichlet 0.1", kind="equivalent", margin=0.1, null=3.0, statistic="exact ratio",
        margin_basis="0.1 of a ratio: the round counter FedCAda sends down (one float) is within it",
        deviations=(*FEDADAMOM_DEVIATIONS, costs, "FedCAda's update rule is fedrun's reconstruction (x, m, v down "
                    "and up: docs/algorithms/fadas_fedcada_fafed_async.md)"), metric="floats_per_client",
        round="whole run", a=_files(low["FedCAda"]), b=_files(low["FedAdamom"]), command=cmd))
    out.append(ClaimSpec(
        id="fafed-partial/FAFED-full-vs-partial", seed=FEDADAMOM_SEED, quote=Q_COST,
        stated="FAFED is designed for full participation and degrades sharply under partial participation",
        run=f"{FEDADAMOM_RUN}; Dirichlet 0.1; FAFED at its chosen client lr with all 20 clients every round (a) "
            "and with S = 4 (b)", kind="greater",
        deviations=(*FEDADAMOM_DEVIATIONS, "'degrades under partial participation' tested as FAFED at full "
                    "participation more accurate at round 60 than at S = 4 of 20; the FedAdamom-vs-FAFED "
                    "accuracy rows compare it with the other servers"), metric="test_accuracy", round="final",
        scale=100, a=_files(fafed_full_specs()), b=_files(low["FAFED"]), command="python experiments/fmnist.py "
        "fafed_full", reason="10 runs of 60 rounds with 20 clients a round, about 20 core-minutes; not run in the "
        "fifth round (no large runs on the shared machine)"))
    out.append(ClaimSpec(
        id="leaf/FedAdamom-vs-best-baseline", seed=FEDADAMOM_SEED, quote=Q_LEAF, role="not run",
        stated="FEMNIST and CelebA at 500 rounds, Shakespeare at 1000, 2000 clients, 5 a round", run="not run",
        deviations=(), kind="greater", metric="test_accuracy", round="final", a=(), b=(),
        reason="the LEAF data sets are not on this machine and 2000-client runs of 500-1000 rounds are beyond two "
               "shared CPU cores"))
    out.append(ClaimSpec(
        id="resnet18-cifar-tinyimagenet/FedAdamom-vs-best-baseline", seed=FEDADAMOM_SEED, quote=Q_FEDADAMOM,
        role="not run", stated=FEDADAMOM_STATED, run="not run", deviations=(), kind="greater",
        metric="test_accuracy", round="final", a=(), b=(),
        reason="ResNet-18 on CIFAR-10/100 and Tiny-ImageNet for 1000 rounds is beyond two shared CPU cores, and the "
               "data sets are not on this machine; the Fashion-MNIST rows above stand in for them"))
    out += beta2_claims()
    out += flatness_claims()
    out += escape_claims()
    return out


def beta2_claims() -> list[ClaimSpec]:
    """β2's insensitivity and its peak at 0.05, at Dirichlet 0.1 and with an i.i.d. partition."""
    out = []
    stated = "CIFAR-10, 1000 rounds, 100 clients at 5%, β2 ∈ {0.01, 0.05, 0.1, 0.2, 0.3}, Dir(0.3) and i.i.d."
    basis = (f"{MARGIN_BASIS}; the paper's own spread over β2 is 0.80 points (Dir(0.3): 88.13-88.93) and 0.51 "
             "(i.i.d.: 91.32-91.83), so the margin is 2.5 times the paper's whole spread")
    grid = ", ".join(map(str, BETA2_GRID))
    for name, specs, cmd, reason in (
            ("", ablation_specs(), ABLATION, ""),
            ("iid/", ablation_iid_specs(), "python experiments/fmnist.py ablation_iid",
             "50 runs of 60 rounds, about 10 core-minutes; not run in the fifth round (no large runs on the "
             "shared machine)")):
        beta = {s["label"].split("=")[1]: [] for s in specs}
        for s in specs:
            beta[s["label"].split("=")[1]].append(s)
        part = "i.i.d. partition" if name else "Dirichlet 0.1"
        run = f"{FEDADAMOM_RUN}; {part}, server lr 1.0, β2 ∈ {{{grid}}}"
        devs = (*FEDADAMOM_DEVIATIONS, "β2 = 0.2 not run" + ("" if name else "; Dirichlet 0.1, not 0.3"))
        for b in ("0.01", "0.1", "0.3"):
            out.append(ClaimSpec(id=f"beta2-insensitive/{name}{b}-vs-0.05", seed=FEDADAMOM_SEED, quote=Q_BETA2,
                                 stated=stated, run=run, margin_basis=basis,
                                 deviations=(*devs, "insensitivity tested as equivalence of the final test "
                                             "accuracy with β2 = 0.05's within ±2 points"),
                                 kind="equivalent", margin=MARGIN, metric="test_accuracy", round="final", scale=100,
                                 a=_files(beta[b]), b=_files(beta["0.05"]), command=cmd, reason=reason))
            out.append(ClaimSpec(id=f"beta2-peak/{name}0.05-vs-{b}", seed=FEDADAMOM_SEED, quote=Q_BETA2,
                                 stated=stated, run=run,
                                 deviations=(*devs, "the peak tested as β2 = 0.05 more accurate than each other β2"),
                                 kind="greater", metric="test_accuracy", round="final", scale=100,
                                 a=_files(beta["0.05"]), b=_files(beta[b]), command=cmd, reason=reason))
    return out


def flatness_claims() -> list[ClaimSpec]:
    """Flatness and loss of the final models, and (exploratory) flatness at a common training loss."""
    out = []
    trained = sorted(fedadamom_specs(True, (0.1,)), key=lambda s: s["seed"])

    def measured(out: Path) -> dict[str, tuple[str, ...]]:
        return {m: tuple(str(flatness_file(s, out).relative_to(REPO)) for s in trained
                         if s["label"].split(" ")[0] == m) for m in SAME_LOSS_LABELS}

    flat, same_loss = measured(FLATNESS_OUT), measured(SAME_LOSS_OUT)
    devs = (*FEDADAMOM_DEVIATIONS,
            "flatness as the top Hessian eigenvalue of the loss on 2,000 training examples (Lanczos, residual "
            "checked), not the paper's loss-landscape plots; lower loss as that sample's loss",
            "the models retrained from the runs' configs (trained models are not kept): final test accuracy "
            "within 1.2 points of the runs' own (median 0.24)", "not tested: 'which goes with better "
            "generalization' (the accuracy rows compare accuracy, not its link to flatness)")
    for other in ("FedAdam", "FedAvgM"):
        for metric, what in (("top_eigenvalue", "flatter"), ("train_loss", "lower loss")):
            out.append(ClaimSpec(
                id=f"flatness/{metric}/FedAdamom-vs-{other}", seed=FEDADAMOM_SEED, quote=Q_FLAT,
                stated="loss-landscape visualisation of the trained global models", run=f"{FEDADAMOM_RUN}; "
                "Dirichlet 0.1; `fedrun flatness` on each final model",
                deviations=(*devs, "the final models (round 60), not minima reached at the same training loss",
                            f"{what}: a lower {metric}"),
                kind="less", metric=metric, round="final", a=flat["FedAdamom"], b=flat[other],
                command="python experiments/fmnist.py flatness"))
        out.append(ClaimSpec(
            id=f"flatness-same-loss/top_eigenvalue/FedAdamom-vs-{other}", seed=FEDADAMOM_SEED, quote=Q_FLAT,
            stated="loss-landscape visualisation of the trained global models", run=f"{FEDADAMOM_RUN}; "
            "Dirichlet 0.1; `fedrun flatness` on each model at its seed's common training loss",
            role="exploratory",
            deviations=(*devs, "exploratory: this analysis was added after the same-round rows were inconclusive, "
                        "so its verdict is not a test of the claim", "the common training loss of a seed is the "
                        "lowest sample loss FedAdamom, FedAdam and FedAvgM all reach within 60 rounds; each model "
                        "is the first round's at or below it (a checkpoint after every round), so the models are "
                        "of different rounds (measured_rounds)", "flatter: a lower top_eigenvalue"),
            kind="less", metric="top_eigenvalue", round="common loss", a=same_loss["FedAdamom"], b=same_loss[other],
            command="python experiments/fmnist.py flatness_same_loss"))
    return out


ESCAPE_RUN = ("Styblinski-Tang scaled by sqrt(k), d = 2, k ∈ {1, ..., 3}, 2000 particles per optimizer and k, "
              "s = 5 clients, K = 5, T_max = 1e5 rounds (experiments/escape_rate.yaml)")


def escape_claims() -> list[ClaimSpec]:
    """The escape-rate experiment's fits and the momentum-neutrality check, from their committed files."""
    analysis, neutral = "docs/results/escape_rate/analysis.json", "docs/results/escape_rate/momentum_neutrality.json"
    devs = ("the paper does not publish its protocol: fedrun's reconstruction (docs/results.md, escape rate)",
            "tested by the protocol's criteria set before the run: r(1/k) ≥ 0.99, r(1/k) > r(1/sqrt k) and the "
            "fitted exponent p ∈ [0.75, 1.25] (FedAvgM, FedAdamom); r(1/sqrt k) > r(1/k) and p ∈ [0.3, 0.7] "
            "(FedAdam); the page's prefactor and cold fits are exploratory and not rows")
    out = [ClaimSpec(id=f"escape/{opt}", seed=FEDADAMOM_SEED, quote=Q_ESCAPE,
                     stated="−log Γ = O(1/k) for FedAvgM and FedAdamom (Pearson 0.998), O(1/sqrt k) for FedAdam",
                     run=ESCAPE_RUN, deviations=devs, kind="equivalent", statistic="fitted exponent",
                     metric="escape_exponent", round=opt, a=(analysis,), b=(),
                     command="python experiments/escape_analysis.py docs/results/escape_rate/escape_rate.json")
           for opt in ("fedavgm", "fedadamom", "fedadam")]
    out.append(ClaimSpec(
        id="momentum-neutrality/FedAvg-vs-FedAvgM", seed=FEDADAMOM_SEED, quote=Q_NEUTRAL,
        stated="FedAvgM's escape time depends on η and β through η/(1 − β) only", run=f"{ESCAPE_RUN}; k = 2, "
        "FedAvg at server lr 1 against FedAvgM(η = 0.1, β = 0.9), the same η/(1 − β)",
        deviations=(devs[0], "tested as the ratio of the two escape rates at one k, with its Poisson 95% interval: "
                    "neutral when the interval holds 1"),
        kind="equivalent", statistic="rate ratio", metric="escape_ratio", round="k = 2", a=(neutral,), b=(),
        command="python experiments/momentum_neutrality.py --config experiments/escape_rate.yaml --out "
                "docs/results/escape_rate/momentum_neutrality.json"))
    return out


def probe_claims() -> list[ClaimSpec]:
    """The reconstruction probe's arms as entries of their own: FedSUM read without K and without the stale
    step (N = 20, against MIFA's runs at the shared η0) and FedSUM at N = 100 (against MIFA at N = 100)."""
    lr = shared_lr()
    specs = probe_specs()
    out = []
    for p in ("p2", "p3"):
        mifa = _files(fedsum_specs(lr, patterns=(p,), labels=["MIFA"]))
        ref = _files(fedsum_specs(lr, patterns=(p,), labels=["FedAvg"]))
        n20 = (f"Fashion-MNIST, {p.upper()}, N = 20, S = 4, K = 5, batch 32, η_l = η0/sqrt(t/10 + 1) at the shared "
               f"η0 = {lr}, η_g = 1, 100 rounds, seeds 0-9")
        n100 = (f"Fashion-MNIST, {p.upper()}, N = 100, S = 20 (the same 20% rate), about 600 examples per client, "
                f"K = 5, batch 32, η_l = η0/sqrt(t/10 + 1) at η0 = {lr}, η_g = 1, 100 rounds, seeds 0-9 "
                "(configs/fmnist/fedsum_paper.yaml with the N = 20 recipe)")
        at_n100 = (FEDSUM_DEVIATIONS[0], "K = 5 local steps, not 10; batch 32, not 128", FEDSUM_DEVIATIONS[4],
                   *shared_deviations(lr)[5:])
        arms = {"FedSUM no-K": ("x −= η_l y/N, the server step without K (algorithm.global_lr = 1/K)", n20, mifa,
                                ref, shared_deviations(lr)),
                "FedSUM skip-empty": ("no server step in a round without clients", n20, mifa, ref,
                                      shared_deviations(lr)),
                "FedSUM N=100": ("the reconstruction at N = 100, against MIFA at N = 100: the scale, not the rule, "
                                 "changes", n100, _by(specs, f"probe/{p}", "MIFA N=100"), (), at_n100)}
        for label, (reading, run, b, reference, devs) in arms.items():
            out.append(ClaimSpec(
                id=f"probe/{p.upper()}/{label.replace(' ', '-')}-vs-MIFA", seed=FEDSUM_SEED, quote=Q_FIG1A,
                stated=FEDSUM_STATED, role="probe", opponent="MIFA", reference=reference, run=run,
                deviations=(*devs, f"arm: {reading}; it shows how much the reading decides in the fig1a-faster-final "
                            "FedSUM-vs-MIFA rows, and is not the paper's algorithm either"),
                kind="greater", metric="test_accuracy", round="final", scale=100, a=_by(specs, f"probe/{p}", label),
                b=b, command="python experiments/fmnist.py probe"))
    return out


def paper_grid_claims() -> list[ClaimSpec]:
    """The FedSUM comparison's rows again at FedAvg's choice on the paper's η0 grid (pending while its runs
    are missing)."""
    return fedsum_claims(paper_grid_lr(), "paper-grid/", "python experiments/fmnist.py paper_grid",
                         "270 runs of 100 rounds (9 algorithms x P1-P3 x 10 seeds), about 75 core-minutes; not run "
                         "in the fifth round (no large runs on the shared machine)")


def page_claims() -> list[ClaimSpec]:
    """Every claim the page judges, in the page's order."""
    return [*fedsum_claims(), *probe_claims(), *appendix_claims(), *fadamgc_claims(), *fedadamom_claims(),
            *paper_grid_claims()]
