"""NegBench (Alhamoud et al., CVPR 2025; m1k2zoo/negbench): negation in multiple-choice
questions, read from the published MCQ CSV files (`images/<name>_mcq_*.csv`: image_path,
caption_0..caption_3, correct_answer, correct_answer_template).

Both protocols score as the official benchmarks/src/evaluation/mcq.py (and the CS-CLIP
authors' loader): the prediction is torch.argmax over the candidates (a tie goes to the
first), right when it is correct_answer. Not read: the retrieval CSVs (Recall@k over a
gallery, not a choice).

MSR-VTT MCQ (`videos/msr_vtt_mcq_rephrased_llama.csv`, same columns, image_path naming
an MSR-VTT video), subset `msrvtt_mcq`, read with OpenCV (opencv-python-headless, the
`video` extra). Official (NegBench's CsvVideoMCQDataset + VideoCLIP): four frames, the
rounded midpoints of four equal spans of [0, frames - 1] (UniformFrameSampler), each
frame's cosine with a caption averaged (= the cosine with the mean of the normalised
frame embeddings, which is what VideoCLIP scores, up to a positive scale that argmax
ignores). Paper (the CS-CLIP authors' NegBenchDataset): the first frame alone. Both
score a video they cannot read as a black frame; here it is a counted skip."""

from __future__ import annotations

import csv
import io
import logging
import os
import posixpath
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

from csclip.errors import DataError
from csclip.eval.encoder import FeatureTables
from csclip.eval.suites.core import (
    UNREADABLE_IMAGE,
    BenchmarkNotFound,
    ImageFolder,
    SubsetScores,
    SuiteData,
    TextChoice,
    choice_correct,
    exists,
    expect,
    join,
)
from csclip.storage import filesystem_for, read_bytes

log = logging.getLogger(__name__)

LAYOUT = ("images/COCO_val_mcq_llama3.1_rephrased.csv, "
          "images/VOC2007_mcq_llama3.1_rephrased.csv and/or "
          "videos/msr_vtt_mcq_rephrased_llama.csv (image_path, caption_0..caption_3, "
          "correct_answer), with each image_path's last folder and file (val2017/<file>, "
          "JPEGImages/<file>; a video's also under negbench/videos/) under negbench/")
MCQ_FILES = {"coco_mcq": "COCO_val_mcq_llama3.1_rephrased.csv",
             "voc2007_mcq": "VOC2007_mcq_llama3.1_rephrased.csv"}
VIDEO_MCQ = ("msrvtt_mcq", "msr_vtt_mcq_rephrased_llama.csv")  # under videos/
NOT_READ = ("COCO_val_retrieval.csv", "msr_vtt_retrieval.csv",
            "COCO_val_negated_retrieval_llama3.1_rephrased_affneg_true.csv")
NUM_FRAMES = 4  # NegBench's CsvVideoMCQDataset(max_frames=4)


@dataclass(frozen=True)
class VideoChoice(TextChoice):
    """An MCQ on a video: `image` is its first scored frame, `frames` all of them."""

    frames: tuple[str, ...] = ()


def frame_indices(num_frames: int, protocol: str) -> list[int]:
    """The frames scored: NegBench's UniformFrameSampler(4) over [0, num_frames - 1]
    (official), or frame 0 (the CS-CLIP authors' extract_video_frame)."""
    if protocol == "paper":
        return [0]

    end = num_frames - 1
    count = min(NUM_FRAMES, end + 1)
    ticks = torch.linspace(start=0, end=end, steps=count + 1, dtype=torch.int)
    return [int(torch.round((a + b) / 2).to(torch.int)) for a, b in zip(ticks[:-1], ticks[1:],
                                                                           strict=True)]


def read_frames(uri: str, protocol: str) -> list[bytes] | None:
    """The scored frames of the video at `uri` as PNG bytes, or None when OpenCV cannot
    read it (or any of those frames)."""
    try:
        import cv2  # noqa: PLC0415  an optional extra (csclip[video]), only for NegBench's videos
    except ImportError as error:
        raise DataError("negbench: reading the MSR-VTT videos needs OpenCV: pip install "
                        "'csclip[video]' (opencv-python-headless)") from error

    filesystem, path = filesystem_for(uri)
    local = path if type(filesystem).__name__ == "LocalFileSystem" else None
    if local is None:  # OpenCV reads files: a remote video goes through a temporary copy
        handle = tempfile.NamedTemporaryFile(suffix=posixpath.splitext(path)[1], delete=False)
        with handle:
            handle.write(read_bytes(filesystem, path))
        local = handle.name
    capture = cv2.VideoCapture(local)
    try:
        if not capture.isOpened():
            return None
        count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        out = []
        for index in frame_indices(max(count, 1), protocol):
            capture.set(cv2.CAP_PROP_POS_FRAMES, index)
            ok, frame = capture.read()
            if not ok:
                return None
            ok, png = cv2.imencode(".png", frame)  # BGR in, RGB PNG out
            out.append(png.tobytes())
        return out
    finally:
        capture.release()
        if local != path:
            os.unlink(local)


def negbench_scores(features: FeatureTables, data: SuiteData) -> dict[str, SubsetScores]:
    """mcq.py's accuracy per subset: argmax (the first maximum) over the candidates of
    the image's cosine, a video's averaged over its frames, equals correct_answer."""
    correct: dict[str, list[bool]] = {}
    for item in data.text_choices:
        frames = item.frames if isinstance(item, VideoChoice) else (item.image,)
        scores = np.mean([features.similarity([frame] * len(item.texts), list(item.texts))
                          for frame in frames], axis=0)
        correct.setdefault(item.subset, []).append(
            choice_correct(scores, item.true_indices, data.tie_rule))
    out = {}
    for subset in data.subsets():
        values = correct.get(subset, [])
        out[subset] = SubsetScores(100.0 * float(np.mean(values)) if values else None, None,
                                   None, len(values))
    return out


def _lookup(folder: ImageFolder, path: str) -> tuple[str | None, str]:
    """The file an absolute image_path of the published CSV names: its last folder and
    file, then its file alone, under the folder's roots (the README asks users to rewrite
    the paths to their own copy; this reads them unchanged): (URI, "") or (None / URI,
    the skip reason)."""
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    reason = ""
    for tail in ("/".join(parts[-2:]), parts[-1] if parts else "", path):
        if tail and not posixpath.isabs(tail):
            uri, why = folder.lookup(tail)
            if why is None:
                return uri, ""
            if uri is not None or not reason:
                reason = why
    return None, reason or "missing_image"


def _image(images: ImageFolder, path: str) -> str | None:
    """The URI of a readable image the CSV's image_path names, or None."""
    return _lookup(images, path)[0]


def _rows(uri: str) -> tuple[list[dict[str, str]], list[str]]:
    """An MCQ CSV's rows and its caption_k columns in order, checked."""
    filesystem, path = filesystem_for(uri)
    rows = list(csv.DictReader(io.StringIO(read_bytes(filesystem, path).decode("utf-8"))))
    columns = set(rows[0]) if rows else set()
    options = sorted((c for c in columns if c.startswith("caption_")),
                     key=lambda c: int(c.split("_")[1]) if c.split("_")[1].isdigit() else 99)
    expect(bool(rows) and {"image_path", "correct_answer"} <= columns and len(options) >= 2,
           uri, "columns image_path, caption_0..caption_3, correct_answer")
    for row in rows:
        expect(str(row["correct_answer"]).strip().isdigit()
               and int(row["correct_answer"]) < len(options), uri,
               "correct_answer is the index of one caption_k")
    return rows, options


def load_negbench(data_root: str, protocol: str = "official") -> SuiteData:
    """NegBench's MCQ subsets under <data_root>/negbench: coco_mcq, voc2007_mcq (images)
    and msrvtt_mcq (videos: frames as `protocol` scores them)."""
    root = join(data_root, "negbench")
    found = {s: join(root, "images", f) for s, f in MCQ_FILES.items()
             if exists(join(root, "images", f))}
    video_csv = join(root, "videos", VIDEO_MCQ[1])
    has_videos = exists(video_csv)
    if not found and not has_videos:
        raise BenchmarkNotFound(f"negbench: not found under {root} (expects {LAYOUT})")
    unread = [f for f in NOT_READ if exists(join(root, "images", f)) or exists(join(root, "videos", f))]
    if unread:
        log.info("negbench: %s not read (retrieval tasks)", ", ".join(unread))
    images = ImageFolder(root)
    data = SuiteData("negbench", tie_rule="argmax_first", scorer=negbench_scores)
    for subset, uri in found.items():
        rows, options = _rows(uri)
        for row in rows:
            ref = _image(images, row["image_path"])
            if ref is None:
                data.skip(subset, example=str(row["image_path"]))
                continue
            data.images[ref] = ref
            data.text_choices.append(TextChoice(subset, ref, tuple(row[c] for c in options),
                                                (int(row["correct_answer"]),)))
    if has_videos:
        _add_videos(data, video_csv, ImageFolder(root, join(root, "videos")), protocol)
    return data


def _add_videos(data: SuiteData, uri: str, videos: ImageFolder, protocol: str) -> None:
    """MSR-VTT MCQ's rows as VideoChoice items, their frames decoded into data.images (a
    video read once however many rows name it)."""
    subset = VIDEO_MCQ[0]
    rows, options = _rows(uri)
    decoded: dict[str, tuple[str, ...] | None] = {}
    for row in rows:
        video, reason = _lookup(videos, row["image_path"])
        if video is not None and not reason and video not in decoded:
            frames = read_frames(video, protocol)
            keys = tuple(f"{video}#frame={i}" for i in range(len(frames or [])))
            data.images.update(zip(keys, frames or [], strict=True))
            decoded[video] = keys if frames else None
        keys = decoded.get(video) if video is not None and not reason else None
        if not keys:
            data.skip(subset, reason=reason or UNREADABLE_IMAGE, example=str(row["image_path"]))
            continue
        data.text_choices.append(VideoChoice(subset, keys[0], tuple(row[c] for c in options),
                                             (int(row["correct_answer"]),), frames=keys))
