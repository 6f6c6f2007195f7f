"""A create-only PUT lands but its response is lost: botocore retries it and gets 412 for
its own write. The archive must take that as success (same content), not as a conflict."""

from __future__ import annotations

from durkv.backends import s3 as ds3

from .storetools import keys, make_store


def test_lost_responses_of_a_segment_and_a_manifest_put_are_success(tmp_path, s3_env, s3,
                                                                      bucket, proxy):
    handler, endpoint = proxy
    handler.drop = {"/segments/00000000000000000001.seg": 1, "/manifests/": 1}
    path = make_store(tmp_path / "a.durkv", 12)
    url = f"s3://{bucket}/p"
    res = ds3.archive(path, url, endpoint_url=endpoint)
    assert handler.drop == {"/segments/00000000000000000001.seg": 0, "/manifests/": 0}
    assert 1 in res.already and 1 not in res.uploaded     # its retry found our own write
    assert res.manifest_no == 0
    assert [k for k in keys(s3, bucket) if "/manifests/" in k] == [
        "p/manifests/00000000000000000000.json"]
    plan, report = ds3.restore(url, tmp_path / "r.durkv")
    assert report.ok and report.next_lsn == 12
