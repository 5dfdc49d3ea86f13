"""The Han and Hangul characters the claude-legacy vocabulary holds as one token each
(its ``tokenizer.json``, MIT license, Copyright 2023 Anthropic, PBC; the license ships
beside it as ``tinyctx/data/claude-legacy-tokenizer.LICENSE``): the common ones,
which cost about a token where the others cost two or three (their bytes split).
``tests/test_token_shapes.py`` rebuilds both from the vocabulary and checks they match."""

from __future__ import annotations

from typing import Final

ONE_TOKEN_HAN: Final = (
    "一万三上下不与专且业东两个中串临为主么义之乐乘也习书买了事二于云互五些交产京人什"
    "仅今从仓他付代令以们件价任份企优会传似但位体何余作你使例供依保信修個候値值假做停"
    "储像元充先光克入全公共关兴其具典内册再写决况准减几出击分切划列则初利别到制前剧割"
    "力功加务动助動包化北匹区十半华单南博占卡印即历原去县参及双反发取受变口古句只可台"
    "右号司各合吉同名后向否含启告员周命和品哈响商器四回因团围国图土在地场址均坐块型城"
    "域基報場填境增处备変复外多大天太失头夹好如始子字存学宁它安完定实実客害家容密对导"
    "対射将小少尔就尾局层屏展属山峰川州工左差己已市布带常平年并广庆序库应店度建开异式"
    "引张弹归当录形影径待很後得微德心必志态思性总息您情想意感戏成我或截户房所手才打执"
    "扩批找承技把投报拉拟择括持指按损换据掉排接控推描提換搜播支收改放政效教数整數文料"
    "断新方族旗无日时昌明易星映是显時普景曲更替最月有服期未本术机权束条来板构析林果查"
    "标栏树校样核根格框案档检楼概標模次止正此步武段母每比民水永求江池没河治法波注活流"
    "测海消深清游湖源滑满滤点為热然照爬父片版牌物特状率王环现現理生用由申电画界略発登"
    "白百的监盘目直相省看真着知矩短石码确示社神票离种科秒积称移程空突窗立站章端符第等"
    "答策签简算管箱类精系素索結線红约级线练组细终经结绘给络统继续维编缩网罪置群老考者"
    "而联聚股育能自至致色节花若英范获菜藏行表被装西要见规视览角解言計設计订认让训议记"
    "许论设访证评识词试话询该详语误说请读课调象資负责败账质购费资起超足距路跳身輸车转"
    "轮软轴载较辑输边达过运近返还这进连迭述追退送选递通速造遍道那邮部都配采释里重量金"
    "针钮银链销错键长開間関门闭问间闻队防阳阵际陆限院除随隔集零需青非面音页项顺须预频"
    "题颜额飞首马验高黑默齒龙更滑串句金拉老路率北不數索省若略量力年列令零例了料流率利"
    "易理里林立什切度行神精都器海社突者况全充搜流画直着类者輸"
)
"""788 Han characters, in code point order."""

ONE_TOKEN_HANGUL: Final = (
    "가간값개게경고과구그기까나내는니다단당대도동되된드들라래량러력로료를름리만면문미"
    "번보복부분사산상색서성세소수스습시식아야어에여열오와요용우원위으은을음의이인일입"
    "자작장재전정제주지째치크터트하한할합해행호화환"
)
"""103 Hangul syllables, in code point order."""
