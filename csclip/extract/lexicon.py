"""The rules backend's vocabulary for caption English: object nouns by category (the 80 COCO
categories with their supercategories, plus common scene nouns and the synthetic world's
shapes), attributes by kind, count words, spatial prepositions with antonyms and verbs.

Everything is plain data written out by hand; `csclip.extract.rules` does the parsing.
No downloads: this file is the whole model of English the rules backend has.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Noun:
    """One object noun: its singular and plural forms and its category (object foils stay
    within the category: horse -> cow, never horse -> pizza)."""

    singular: str
    plural: str
    category: str


# category -> nouns. "a/b" gives an irregular plural (or "sheep/sheep"); "_" joins the words
# of a multiword noun. The first block of each category is COCO's own categories
# (supercategory in the comment), then common synonyms and caption nouns of the same kind.
_NOUN_TABLE: dict[str, str] = {
    # COCO supercategory person, split by kind so "man" is foiled by "woman", not "player".
    "person_gendered": "man/men woman/women boy girl lady/ladies guy gentleman/gentlemen",
    "person_age": "child/children kid baby/babies toddler adult teenager",
    # Roles split by kind, so a foil stays a person of the same sort: a passenger is
    # foiled by a pedestrian, never by an umpire.
    "person_sport": (
        "player skier surfer skateboarder snowboarder rider umpire catcher batter pitcher "
        "biker cyclist athlete referee jockey motorcyclist boarder"
    ),
    "person_work": (
        "chef cook worker soldier officer policeman/policemen businessman/businessmen vendor "
        "photographer instructor driver coach employee waiter waitress/waitresses "
        "farmer cowboy clown"
    ),
    "person_other": (
        "person/people tourist student couple family/families crowd bride groom mother "
        "father friend pedestrian passenger spectator audience customer husband wife/wives "
        "user guest owner opponent teen youth/youths son daughter commuter team army/armies "
        "trio"
    ),
    # COCO vehicle, split by kind: a cart is foiled by a wagon, never by a school bus.
    "vehicle": (
        "car motorcycle bus/buses truck motorbike van taxi/taxis tractor scooter jeep suv "
        "vehicle fire_truck pickup_truck school_bus cab semi"
    ),
    "vehicle_rail": "train trolley locomotive subway tram engine",
    "vehicle_air": "airplane plane jet airliner jetliner biplane helicopter",
    "vehicle_water": "boat ship canoe rowboat raft kayak yacht barge sailboat",
    "vehicle_small": "bicycle bike cart wagon carriage trailer buggy/buggies stroller",
    "vehicle_part": "wheel tire paddle oar sail",
    # COCO outdoor
    "outdoor": (
        "traffic_light fire_hydrant stop_sign parking_meter bench/benches hydrant "
        "street_sign sign pole fence statue fountain flag cone sculpture post gate "
        "clock_tower tower lamp_post street_light"
    ),
    # COCO animal
    "animal": (
        "bird cat dog horse sheep/sheep cow elephant bear zebra giraffe cattle/cattle "
        "puppy/puppies kitten goat duck pigeon seagull pony/ponies calf/calves lamb "
        "deer/deer animal fish/fish chicken pheasant"
    ),
    # COCO accessory
    "accessory": "backpack umbrella handbag tie suitcase purse bag luggage/luggage",
    # COCO sports
    "sports": (
        "frisbee snowboard sports_ball kite baseball_bat baseball_glove skateboard "
        "surfboard tennis_racket racket racquet ball bat glove ski skate_board net "
        "tennis_ball soccer_ball snow_board surf_board"
    ),
    # COCO kitchen
    "kitchen": (
        "serving_tray serving_plate serving_bowl bottle wine_glass cup fork knife/knives spoon bowl plate mug glass/glasses pan pot "
        "tray dish/dishes napkin lid utensil basket container jar can platter cutting_board"
    ),
    # COCO food
    "food": (
        "banana apple sandwich/sandwiches orange broccoli/broccoli carrot hot_dog pizza donut "
        "cake doughnut hamburger burger salad bread/bread cheese/cheese meat/meat "
        "fruit/fruit vegetable pie pastry/pastries dessert cookie sausage fries/fries "
        "soup food/food coffee/coffee chocolate/chocolate sauce pasta/pasta rice/rice "
        "noodle ham/ham bacon/bacon egg tomato/tomatoes lettuce/lettuce bean butter/butter "
        "honey/honey tea/tea milk/milk potato/potatoes strawberry/strawberries pineapple "
        "waffle cupcake meal dinner lunch breakfast veggies/veggies beer/beer soda/soda "
        "chips/chips cracker frosting/frosting topping bun hotdog mushroom onion pepper "
        "peppers/peppers cookie muffin bagel steak/steak wine/wine water_bottle"
    ),
    # COCO furniture
    "furniture": (
        "chair couch/couches potted_plant bed dining_table toilet table sofa desk shelf/shelves "
        "cabinet dresser/dressers bookshelf/bookshelves stool furniture/furniture armchair "
        "recliner seat mattress cushion"
    ),
    # COCO electronic
    "electronic": (
        "tv laptop mouse/mice remote keyboard cell_phone phone computer monitor television "
        "screen camera controller tablet video_game game_controller wii_remote "
        "wii_controller cellphone smart_phone mobile_phone printer microphone headphones/"
        "headphones calculator desktop speaker device electronics/electronics appliance"
    ),
    # COCO appliance
    "appliance": "microwave oven toaster sink refrigerator fridge stove dishwasher blender",
    # COCO indoor
    "indoor": (
        "book clock vase scissors/scissors teddy_bear hair_drier toothbrush/toothbrushes "
        "toy lamp pillow blanket towel mirror picture painting candle box/boxes pen rack "
        "case tripod holder portrait poster rug carpet kite_string cord wire hook chalkboard "
        "sheet linen/linens bedspread handle cigarette trash_can"
    ),
    # Beyond COCO: the places and surfaces captions put objects on or in.
    "room": (
        "room kitchen bathroom bedroom living_room dining_room office restaurant store shop "
        "classroom hallway restroom area stall"
    ),
    "outdoor_place": (
        "street road sidewalk field beach park yard city/cities parking_lot airport runway "
        "station platform court tennis_court track/tracks highway/highways intersection bridge "
        "building house zoo farm slope ramp enclosure pasture desert trail path hillside "
        "tarmac garden lawn patio roof ceiling church school hotel town barn stage "
        "hospital dugout curb ledge rail railing train_tracks train_station bus_stop "
        "parking_lot corner market ground/ground pen side_walk porch paddock valley "
        "wilderness/wilderness shore obelisk home"
    ),
    # Nature, split by kind: water is foiled by a lake, never by a hill.
    "ground": (
        "grass/grass snow/snow sand/sand dirt/dirt rock beach_sand hay/hay greenery/greenery "
        "mud/mud moss/moss ice/ice stone weeds/weeds vegetation/vegetation"
    ),
    "water": "water/water ocean lake river wave puddle body_of_water/bodies_of_water pond sea",
    "land": (
        "mountain hill forest woods/woods meadow island landscape countryside grassland "
        "grasslands/grasslands"
    ),
    "plant_life": (
        "tree flower plant bush/bushes leaf/leaves log branch/branches tulip shrub vine "
        "palm_tree palm"
    ),
    "sky_and_weather": (
        "sky/skies sun rain/rain smoke/smoke rainbow cloud sunset sunlight/sunlight fog/fog"
    ),
    "clothing": (
        "shirt hat jacket dress/dresses helmet coat suit uniform sweater cap scarf/scarves "
        "jersey vest shoe shorts/shorts pants/pants boot sunglasses/sunglasses costume skirt "
        "collar heels/heels gear/gear glove jeans/jeans tshirt t-shirt outfit apron "
        "sweatshirt hoodie"
    ),
    "fixture": "wall window door floor counter shower bathtub tub curtain fireplace tile "
    "sink_counter countertop lights/lights doorway",
    # More caption nouns, by kind (seen in COCO captions; their own categories so that
    # object foils stay within the kind).
    "outdoor_more": (
        "billboard barrier tent booth cage hole skyscraper tunnel dock bin feeder vane "
        "meter parking_meter hose fire_hose bleachers/bleachers scaffolding kiosk mailbox "
        "dumpster lamppost canopy"
    ),
    "animal_more": (
        "bull cub bunny/bunnies rooster llama husky/huskies ostrich hippo penguin parakeet "
        "ox/oxen mule donkey squirrel monkey lion tiger wolf/wolves fox/foxes owl parrot "
        "hawk eagle swan goose/geese turkey rabbit"
    ),
    "kitchen_more": (
        "skillet ladle strainer teapot kettle colander grill bucket crate silverware/silverware "
        "dinnerware/dinnerware tablecloth thermos chopsticks/chopsticks whisk "
        "spatula tongs/tongs"
    ),
    "food_more": (
        "grape pancake toast/toast crust pepperoni/pepperoni spinach/spinach parsley/parsley "
        "mustard/mustard olive lemon cherry/cherries tart pickle macaroni/macaroni "
        "marshmallow sprinkles/sprinkles peanut chili/chili salmon/salmon snack treat "
        "beverage garnish condiment ingredient greens/greens broth/broth cream/cream "
        "casserole stuffing/stuffing liquid kale/kale cereal/cereal yogurt/yogurt "
        "oatmeal/oatmeal avocado cucumber zucchini/zucchini corn/corn garlic/garlic "
        "shrimp/shrimp seafood/seafood nut cinnamon/cinnamon icing/icing "
        "cheesecake brownie pretzel taco burrito omelet slice wedding_cake birthday_cake"
    ),
    "furniture_more": (
        "hammock vanity/vanities cupboard cubicle footstool ottoman crib nightstand "
        "headboard futon bunk_bed loveseat"
    ),
    "electronic_more": (
        "console telephone disc disk fan dryer hair_dryer freezer machine vending_machine "
        "projector router modem charger"
    ),
    "indoor_more": (
        "notebook map sticker tag ribbon string cloth soap magazine newspaper frame "
        "ornament decoration balloon marker cane chain coin arrangement collage urinal "
        "extinguisher fire_extinguisher briefcase pin ring necklace bracelet wallet "
        "garbage/garbage trash/trash item equipment/equipment accessory "
        "stuffed_animal doll image "
        "wallpaper/wallpaper comforter quilt bedding/bedding canvas easel pizza_stand fruit_stand cake_stand tv_stand "
        "unit piercing"
    ),
    "clothing_more": (
        "snowsuit wetsuit blazer sneaker lapel bandana robe gown tuxedo overalls/overalls "
        "mittens/mittens socks/socks sock goggles/goggles bikini swimsuit "
        "trunks/trunks kimono"
    ),
    "body_more": (
        "beard foot/feet shoulder chin chest lip tail wing beak toe limb mane horn knee "
        "wrist elbow thumb cheek forehead mustache"
    ),
    "fixture_more": (
        "faucet sill windowsill flooring/flooring pipe cable outlet stairs/stairs staircase "
        "step/steps column pillar beam archway cabinetry/cabinetry"
    ),
    "room_more": (
        "garage bakery cafe eatery deli pantry museum hall suite apartment closet factory "
        "lobby kitchenette cafeteria gym library/libraries studio warehouse"
    ),
    "outdoor_place_more": (
        "backyard neighborhood avenue pavement freeway corral habitat coast mill "
        "lot sandy_lot plaza alley alleyway driveway crosswalk harbor marina pier lane "
        "terminal campus village"
    ),
    # Body parts: what people hold things in or with.
    "body": "hand head mouth neck leg arm eye tooth/teeth tongue paw finger hair/hair face "
    "lap nose ear back",
    # Sports and games, nouns in their own right ("playing tennis", "a tennis player").
    "sport": "tennis/tennis baseball/baseball soccer/soccer basketball/basketball "
    "football/football golf/golf volleyball/volleyball game frisbee_game match/matches "
    "videogame",
    # The synthetic world's objects (csclip/world): shapes are objects like any other.
    "shape": "circle square triangle cross/crosses star rectangle diamond hexagon",
}


def _build_nouns() -> dict[str, Noun]:
    nouns: dict[str, Noun] = {}
    for category, spec in _NOUN_TABLE.items():
        # "food_more" is more food: the suffix only keeps the table readable.
        category = category.removesuffix("_more")
        for item in spec.split():
            singular, _, plural = item.partition("/")
            singular = singular.replace("_", " ")
            plural = plural.replace("_", " ") if plural else _plural(singular)
            noun = Noun(singular, plural, category)
            # First definition wins: "glass" is a kitchen object before it is a material.
            nouns.setdefault(singular, noun)
            nouns.setdefault(plural, noun)
    return nouns


def _plural(word: str) -> str:
    if word.endswith(("s", "sh", "ch", "x")):
        return word + "es"
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


NOUNS: dict[str, Noun] = _build_nouns()

# Nouns that name the same kind of thing (or one a kind of the other): never a foil of each
# other, since "a dog" is still true of a puppy and "a hydrant" of a fire hydrant.
_SAME_THING = (
    "man guy gentleman", "woman lady", "child kid toddler baby", "person adult",
    "bicycle bike", "motorcycle motorbike scooter", "airplane plane jet", "car taxi",
    "boat ship", "truck van", "bus trolley", "fire_hydrant hydrant",
    "stop_sign sign street_sign", "cow cattle calf", "horse pony", "dog puppy", "cat kitten",
    "sheep lamb", "handbag purse bag", "suitcase luggage bag", "sports_ball ball",
    "tennis_racket racket racquet", "baseball_bat bat", "baseball_glove glove", "ski skis",
    "wine_glass glass", "cup mug glass", "plate dish tray", "pot pan",
    "donut doughnut", "hamburger burger sandwich", "cake dessert pie pastry",
    "couch sofa", "dining_table table desk", "potted_plant plant", "shelf bookshelf",
    "tv television monitor screen", "laptop computer", "cell_phone phone",
    "remote controller", "refrigerator fridge", "oven stove microwave",
    "teddy_bear toy", "picture painting", "room bedroom living_room",
    "street road highway", "sidewalk side_walk street", "field park yard farm",
    "beach sand beach_sand shore", "ocean lake river water wave", "mountain hill",
    "court tennis_court", "track tracks", "building house", "store shop",
    "hat cap helmet", "shirt jersey", "jacket coat sweater", "bathtub tub", "shower bathtub",
    "snowboard snow_board", "surfboard surf_board", "linen sheet bedspread",
    "game match videogame video_game", "couple family crowd",
    "rider player skier surfer skateboarder snowboarder", "chef cook",
    "officer policeman soldier", "rock stone", "counter countertop sink_counter", "grass field", "food meat",
    "fruit apple banana orange", "vegetable broccoli carrot", "meat sausage hot_dog",
    "boat ship yacht sailboat barge", "canoe kayak", "airplane plane jet airliner jetliner biplane",
    "train locomotive engine subway", "trolley tram", "cart wagon", "carriage buggy",
    "car cab", "truck semi pickup_truck fire_truck", "cow bull ox", "dog husky",
    "rabbit bunny", "bear cub", "rock stone", "cupboard cabinet", "closet cabinet",
    "couch loveseat futon", "dryer hair_dryer hair_drier", "telephone phone",
    "drink beverage", "treat snack dessert", "grass grassland grasslands meadow",
    "sea ocean", "pond lake", "backyard yard", "avenue street road", "pavement sidewalk",
    "garbage trash", "sneaker shoe", "mustache beard", "foot feet", "pipe cable",
    "toast bread", "cream frosting icing", "image picture painting poster",
)
SAME_THING_GROUPS: dict[str, frozenset[str]] = {}
for _group in _SAME_THING:
    _members = frozenset(w.replace("_", " ") for w in _group.split())
    for _word in _members:
        SAME_THING_GROUPS[_word] = SAME_THING_GROUPS.get(_word, frozenset()) | _members

# Generic nouns: fine as entities, never as foils ("cat" -> "animal" would be true).
NOT_FOILS = frozenset(
    "animal vehicle food person people adult crowd family couple player rider worker sign "
    "toy fruit vegetable dessert bag ball glass building room water plant screen computer "
    "phone dish pastry area furniture meal game ground corner match user home seat tower "
    "post case holder container gear outfit friend lunch dinner breakfast veggies topping "
    "frosting student mother father device electronics appliance item equipment accessory "
    "machine unit decoration treat snack beverage ingredient condiment vegetation garbage "
    "trash team trio youth guest owner opponent army boat image lot".split()
) | {"body of water"}

# Where object foils of a generic noun come from: "people" could be skiers or fathers (so
# no person noun is clearly false of them), but never dogs.
FOIL_CATEGORY_OF_GENERIC: dict[str, str] = {
    "person": "animal", "people": "animal", "adult": "animal", "crowd": "animal",
    "family": "animal", "couple": "animal", "friend": "animal", "mother": "animal",
    "father": "animal", "student": "animal", "worker": "animal", "team": "animal",
    "guest": "animal", "owner": "animal", "opponent": "animal", "youth": "animal",
    "teen": "animal",
}


MAX_NOUN_WORDS = max(len(form.split()) for form in NOUNS)

# Nouns that frame the picture rather than name something in it: "a photo of a cat" is a
# cat. The framing words are skipped together with the "of" that follows them.
FRAME_WORDS = frozenset(
    "picture photo photograph image view closeup close-up shot snapshot scene".split()
)
FRAME_PHRASES = ("close up of", "close up view of", "closeup of", "view of", "scene with",
                 "scene of", "scene showing", "picture showing", "photo showing")

# Collective and partitive heads kept as part of the entity text ("group of sheep", "slice
# of pizza"); the object is the noun after "of".
COLLECTIVES = frozenset(
    "group bunch couple pair herd flock few pile stack row line set crowd "
    "team variety assortment collection slice piece plate bowl cup glass box tray bottle can "
    "jar vase basket carton bag".split()
)
COLLECTIVE_BASES = COLLECTIVES
COLLECTIVES = COLLECTIVES | frozenset(_plural(w) for w in COLLECTIVES)
PLURAL_COLLECTIVES = frozenset({"couple", "pair", "few"})
# Collectives of many members ("a group of children", "a pair of scissors"), unlike
# containers ("a bottle of milk"): an object foil's new member noun is plural.
GROUP_COLLECTIVES = frozenset(
    "group bunch couple pair herd flock few pile stack row line set crowd team variety "
    "assortment collection".split()
)
GROUP_COLLECTIVES = GROUP_COLLECTIVES | frozenset(_plural(w) for w in GROUP_COLLECTIVES)
# Vague amounts dropped from the entity text: "a lot of girls" is "girls".
QUANTITY_PREFIXES = frozenset({"lot", "lots", "number", "plenty", "rest"})

# ------------------------------------------------------------------------------------------
# Attributes: kind -> values. An attribute foil changes one value within its kind.
# ------------------------------------------------------------------------------------------

COLORS: tuple[str, ...] = (
    "red", "blue", "green", "yellow", "white", "black", "brown", "gray", "grey", "orange",
    "pink", "purple", "tan", "silver", "gold", "beige",
)
SIZES: tuple[str, ...] = ("small", "large", "big", "little", "tiny", "huge", "tall", "short",
                          "giant", "long")
MATERIALS: tuple[str, ...] = ("wooden", "metal", "plastic", "stone", "brick", "leather",
                              "ceramic", "concrete", "steel", "glass", "paper", "cardboard")
STATES: tuple[str, ...] = ("young", "old", "wet", "dry", "empty", "full", "open", "closed",
                           "clean", "dirty", "hot", "cold", "new", "sliced", "whole", "cooked",
                           "raw", "lit", "dark", "bright")
COUNTS: tuple[str, ...] = ("two", "three", "four", "five", "six", "seven", "eight", "nine",
                           "ten", "twelve")

ATTRIBUTE_KIND: dict[str, str] = {
    **{w: "color" for w in COLORS},
    **{w: "size" for w in SIZES},
    **{w: "material" for w in MATERIALS},
    **{w: "state" for w in STATES},
    **{w: "count" for w in COUNTS},
}
# Sizes and states are foiled by their opposite, not by any other value: "small" -> "large"
# is clearly false, "small" -> "little" is the same thing.
ATTRIBUTE_ANTONYMS: dict[str, str] = {
    "small": "large", "large": "small", "big": "small", "little": "big", "tiny": "huge",
    "huge": "tiny", "tall": "short", "short": "tall", "giant": "tiny", "long": "short",
    "young": "old", "old": "young", "wet": "dry", "dry": "wet", "empty": "full",
    "full": "empty", "open": "closed", "closed": "open", "clean": "dirty", "dirty": "clean",
    "hot": "cold", "cold": "hot", "new": "old", "sliced": "whole", "whole": "sliced",
    "cooked": "raw", "raw": "cooked", "dark": "bright", "bright": "dark",
}
# Colors that name the same hue: never foil one by the other.
COLOR_SYNONYMS: dict[str, frozenset[str]] = {
    "gray": frozenset({"grey", "silver"}), "grey": frozenset({"gray", "silver"}),
    "silver": frozenset({"gray", "grey"}), "gold": frozenset({"yellow", "tan", "beige"}),
    "tan": frozenset({"beige", "brown", "gold"}), "beige": frozenset({"tan", "gold"}),
}

# Adjectives kept in the entity text but without a foil (no clear opposite in the picture).
OTHER_ADJECTIVES = frozenset(
    "colorful striped spotted cute adult stuffed fresh busy modern vintage antique "
    "double decker parked grassy snowy sandy rocky wild baby polar passenger "
    "commercial electric digital fancy ornate tiled frosted fluffy furry shiny smiling "
    "male female elderly pretty beautiful nice different various colored high flat outdoor "
    "lush cloudy sunny public wooded clear broken stopped glazed grilled fried messy odd "
    "single plain tasty wide low mixed blurry crowded professional historic neon "
    "electronic personal residential homeless pregnant blonde floral flowered stainless "
    "shaded fenced enclosed healthy delicious uncooked unmade light "
    "shirtless sleeveless headless hatless shoeless leafless hairless toothless topless "
    "strapless armless legless "
    "several many few half smaller larger bigger taller older younger".split()
)
# Adjectives that only fit the noun they came with: an object foil drops them with it
# ("polar bear" -> "zebra", not "polar zebra"; "glazed donut" -> "cake", not "glazed cake").
HEAD_BOUND_ADJECTIVES = frozenset(
    "stuffed double decker parked baby polar passenger commercial electric glazed grilled "
    "fried frosted uncooked unmade homeless pregnant blonde elderly male female tiled grassy "
    "snowy sandy rocky wooded lush cloudy sunny fenced enclosed residential stainless "
    "smiling flowered floral historic professional public neon digital".split()
)
# Age words, and the nouns that carry an age of their own: with an age word, an object foil
# of a person keeps the kind of noun ("young man" -> "young woman", "little girl" ->
# "little boy"; never "elderly boy").
AGE_WORDS = frozenset("young younger old older elderly little baby adult teenage aged".split())
AGE_BOUND_NOUNS = frozenset(
    "boy girl child kid baby toddler teenager adult teen youth son daughter".split()
)
# Quantity words kept in the entity text; no count foil, since they are vague.
QUANTITIES = frozenset({"several", "many", "multiple", "numerous", "various", "few"})

DETERMINERS = frozenset(
    "a an the some this that these those his her its their my your our one each every "
    "any another other".split()
)
INTENSIFIERS = frozenset({"very", "really", "quite", "rather", "extremely", "fairly"})

# ------------------------------------------------------------------------------------------
# Spatial prepositions and their antonyms. Multiword first: parsing takes the longest match.
# ------------------------------------------------------------------------------------------

PREPOSITION_ANTONYMS: dict[str, str | None] = {
    "on top of": "under", "on": "under", "onto": None, "under": "on", "underneath": "above",
    "beneath": "above", "above": "below", "below": "above", "over": "under",
    "in front of": "behind", "behind": "in front of", "left of": "right of",
    "right of": "left of", "to the left of": "to the right of",
    "to the right of": "to the left of", "inside": "outside", "inside of": "outside of",
    "outside": "inside", "outside of": "inside of", "near": "far from", "next to": "far from",
    "beside": "far from", "close to": "far from", "far from": "near", "by": None,
    "in": None, "into": "out of", "out of": "into", "at": None, "toward": "away from",
    "towards": "away from", "away from": "toward", "across": None, "across from": None,
    "along": None, "through": None, "around": None, "past": None, "against": None,
    "between": None, "among": None, "up": "down", "down": "up", "off": "on",
    "with": None, "without": None, "for": None, "to": None, "from": None,
    "in the middle of": None, "on the side of": None, "at the top of": "at the bottom of",
    "at the bottom of": "at the top of", "full of": None,
    "on the edge of": None, "at the edge of": None, "in the shade of": None,
    "on the back of": None, "at the end of": None, "on the front of": None,
    "in the corner of": None, "on the top of": "at the bottom of", "in the back of": None,
    "on either side of": None, "on both sides of": None, "full with": None,
    "at the back of": None,
    "on the other side of": None, "at the side of": None, "by the side of": None,
}
# Nouns that are part of a preposition ("in the back of"): not entities there.
PREPOSITION_NOUNS = frozenset(w.split()[2] for w in PREPOSITION_ANTONYMS
                              if len(w.split()) == 4 and w.split()[1] == "the")
PREPOSITIONS: tuple[str, ...] = tuple(sorted(PREPOSITION_ANTONYMS, key=lambda p: -len(p.split())))
MAX_PREPOSITION_WORDS = max(len(p.split()) for p in PREPOSITIONS)
# Relations that hold both ways: swapping their arguments gives a true sentence, never a foil.
SYMMETRIC_PREPOSITIONS = frozenset(
    {"next to", "near", "beside", "by", "close to", "far from", "across from", "between",
     "among", "with", "against", "along"}
)

# ------------------------------------------------------------------------------------------
# Verbs: base form -> -ing form (irregular ones spelled out; regular ones derived).
# ------------------------------------------------------------------------------------------

_VERBS = (
    "ride:riding hold:holding sit:sitting stand:standing eat:eating carry:carrying "
    "walk:walking play:playing look:looking fly:flying lay:laying lie:lying run:running "
    "use:using wear:wearing watch:watching drive:driving pull:pulling push:pushing "
    "throw:throwing catch:catching hit:hitting swing:swinging graze:grazing drink:drinking "
    "cut:cutting talk:talking read:reading surf:surfing ski:skiing skateboard:skateboarding "
    "jump:jumping cross:crossing wait:waiting rest:resting sleep:sleeping lean:leaning "
    "hang:hanging pose:posing sleep:sleeping park:parking feed:feeding chase:chasing "
    "climb:climbing enter:entering leave:leaving exit:exiting open:opening close:closing "
    "travel:traveling move:moving head:heading go:going come:coming swim:swimming "
    "float:floating perch:perching sail:sailing land:landing take:taking kick:kicking "
    "face:facing stare:staring point:pointing reach:reaching touch:touching pet:petting "
    "brush:brushing prepare:preparing cook:cooking serve:serving sniff:sniffing "
    "lick:licking bite:biting hug:hugging kiss:kissing shake:shaking fill:filling "
    "block:blocking follow:following lead:leading cover:covering share:sharing "
    "nap:napping snuggle:snuggling display:displaying show:showing contain:containing "
    "overlook:overlooking approach:approaching pass:passing skate:skating "
    "snowboard:snowboarding sit:sitting stick:sticking peek:peeking crouch:crouching "
    "kneel:kneeling squat:squatting hover:hovering roam:roaming drag:dragging "
    "tow:towing grab:grabbing operate:operating place:placing flip:flipping wash:washing "
    "balance:balancing pitch:pitching perform:performing smoke:smoking reflect:reflecting "
    "view:viewing sell:selling hand:handing stretch:stretching laugh:laughing "
    "return:returning type:typing speak:speaking clean:cleaning fall:falling help:helping "
    "extend:extending offer:offering travel:traveling spray:spraying trim:trimming "
    "pick:picking paddle:paddling wave:waving guide:guiding grow:growing relax:relaxing "
    "slide:sliding feature:featuring herd:herding write:writing include:including "
    "punch:punching listen:listening growl:growling adorn:adorning practice:practicing "
    "chew:chewing dip:dipping march:marching gaze:gazing milk:milking depict:depicting "
    "line:lining race:racing order:ordering enjoy:enjoying try:trying fight:fighting "
    "work:working make:making stare:staring film:filming sit:sitting hold:holding "
    "check:checking admire:admiring examine:examining inspect:inspecting wander:wandering "
    "huddle:huddling dance:dancing sing:singing smile:smiling glide:gliding soar:soaring "
    "wade:wading dive:diving roll:rolling toss:tossing haul:hauling load:loading "
    "unload:unloading fix:fixing repair:repairing build:building paint:painting "
    "draw:drawing slice:slicing chop:chopping bake:baking grill:grilling fry:frying "
    "lift:lifting carry:carrying drop:dropping hide:hiding explore:exploring "
    "observe:observing protect:protecting shelter:sheltering surround:surrounding "
    "cross:crossing"
)
VERB_ING: dict[str, str] = dict(item.split(":") for item in _VERBS.split())
# Past participles read as states: "a vase filled with flowers" -> "vase is filled with".
PARTICIPLES = frozenset(
    "filled covered topped parked surrounded stacked attached loaded decorated painted "
    "placed lined displayed piled perched mounted seated dressed held tied stuffed "
    "made set arranged gathered shown seen pictured positioned embedded served propped "
    "suspended grouped planted leaned curled huddled hooked stopped tucked wrapped stored "
    "kept framed hung installed strapped taped chained docked reflected located situated "
    "lit posed littered illuminated crowded "
    "strewn scattered cluttered packed".split()
)
# Past participles of actions, with the active -ing form: "pulled by a horse" is read as
# "horse is pulling" (the agent is the subject). Stative ones ("covered by snow") stay.
AGENT_PARTICIPLES: dict[str, str] = {
    "pulled": "pulling", "followed": "following", "ridden": "riding", "held": "holding",
    "pushed": "pushing", "carried": "carrying", "chased": "chasing", "watched": "watching",
    "driven": "driving", "led": "leading", "fed": "feeding", "towed": "towing",
    "herded": "herding", "eaten": "eating", "thrown": "throwing", "caught": "catching",
    "petted": "petting", "guided": "guiding", "walked": "walking", "hugged": "hugging",
    "kicked": "kicking", "hit": "hitting", "flown": "flying", "worn": "wearing",
    "used": "using", "cut": "cutting", "served": "serving", "played": "playing",
}
# Verb-level antonyms: predicates whose opposite is another verb, not another preposition.
VERB_ANTONYMS: dict[str, str] = {
    "sitting": "standing", "standing": "sitting", "entering": "leaving", "leaving": "entering",
    "exiting": "entering", "pushing": "pulling", "pulling": "pushing", "opening": "closing",
    "closing": "opening", "throwing": "catching", "catching": "throwing",
    "coming": "going", "going": "coming", "landing": "taking off", "following": "leading",
    "leading": "following",
}
# Whole-verb forms ("rides", "sat") mapped back to the base form for normalisation.
IRREGULAR_FORMS: dict[str, str] = {
    "sat": "sit", "stood": "stand", "ate": "eat", "held": "hold", "rode": "ride",
    "flew": "fly", "lies": "lie", "ran": "run", "took": "take", "goes": "go", "has": "have",
    "travelling": "travel", "gets": "get",
}
# Adverbs skipped between a verb and its preposition ("napping together on").
SKIPPABLE_ADVERBS = frozenset(
    "together happily quietly peacefully also just still currently alone closely "
    "patiently calmly nearby".split()
)
# Particles that may sit between a verb and its preposition ("lying down in").
PARTICLES = frozenset({"up", "down", "out", "off", "over", "around", "back", "away"})
# Fixed adverbial phrases that carry no unit; dropped from the words between phrases.
ADVERBIAL_PHRASES: tuple[list[str], ...] = tuple(
    p.split() for p in (
        "in the background", "in the foreground", "in the distance", "at night",
        "on display", "each other", "one another", "during the day", "in the daytime",
        "at the same time", "in the air", "in the sun", "in the snow", "in the rain",
        "side by side", "next to each other", "in a row", "in a line",
    )
)
AUXILIARIES = frozenset({"is", "are", "was", "were", "be", "being", "been"})
RELATIVE_WORDS = frozenset({"that", "which", "who", "while", "whilst"})
# Adjectives that say a thing is not there: the noun goes to the record's absent list.
LESS_ADJECTIVES: dict[str, str] = {
    "shirtless": "shirt", "sleeveless": "sleeves", "headless": "head", "hatless": "hat",
    "shoeless": "shoes", "leafless": "leaves", "hairless": "hair", "toothless": "teeth",
    "topless": "top", "strapless": "straps", "armless": "arms", "legless": "legs",
}
# Signs named by what they forbid ("a no bicycles sign"): the sign is there.
SIGN_NOUNS = frozenset({"sign", "street sign", "stop sign"})
# Existential openings: "There is a cat on a mat" describes a cat.
EXISTENTIAL = ("there is", "there are", "there's", "here is", "here are")
